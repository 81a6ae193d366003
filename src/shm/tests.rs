use super::*;

/// A POSIX shared-memory object of `len` bytes, removed on drop.
struct Object(std::ffi::CString);

impl Object {
    fn new(tag: &str, len: usize) -> Object {
        let key = std::ffi::CString::new(format!("/sluice-test-{tag}-{}", std::process::id())).unwrap();
        unsafe {
            let fd = libc::shm_open(key.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
            assert!(fd >= 0);
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            libc::close(fd);
        }
        Object(key)
    }
    fn key(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        unsafe { libc::shm_unlink(self.0.as_ptr()) };
    }
}

/// A registry with shared memory turned on.
fn on(budget: ByteBudget) -> SharedMemory {
    let cfg = crate::config::SharedMemoryConfig {
        enabled: true,
        ..Default::default()
    };
    SharedMemory::new(&cfg, budget)
}

fn at(region: &str, offset: usize, byte_size: usize) -> ShmRef {
    ShmRef {
        region: region.into(),
        offset,
        byte_size,
    }
}

fn read_i32(shm: &SharedMemory, r: &ShmRef) -> Result<TensorData, Error> {
    shm.read(r, "input `x`", &mut |b| {
        Ok(TensorData::I32(
            b.chunks(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        ))
    })
}

#[test]
fn written_outputs_read_back_within_the_registered_range() {
    let object = Object::new("rw", 10_000);
    let shm = on(ByteBudget::new(1 << 20));
    // An offset past the first page: the mapping starts at its page.
    shm.register("r", object.key(), 4100, 64).unwrap();
    assert_eq!(shm.status(None).unwrap()[0].byte_size, 64);
    shm.write(&at("r", 8, 16), &TensorData::I32(vec![1, -2, 3, 4]), "output `y`")
        .unwrap();
    assert_eq!(
        read_i32(&shm, &at("r", 8, 16)).unwrap(),
        TensorData::I32(vec![1, -2, 3, 4])
    );
    // Out of the region: refused, naming the sizes.
    let e = read_i32(&shm, &at("r", 56, 16)).unwrap_err().to_string();
    assert!(
        e.contains("16 bytes at offset 56 do not fit shared memory region 'r' of 64 bytes"),
        "{e}"
    );
    let e = shm
        .write(&at("r", 0, 8), &TensorData::I32(vec![1, 2, 3]), "output `y`")
        .unwrap_err();
    assert!(e.to_string().contains("12 bytes of output do not fit"), "{e}");
    let e = read_i32(&shm, &at("nope", 0, 4)).unwrap_err().to_string();
    assert!(e.contains("region 'nope' is not registered"), "{e}");
}

#[test]
fn registration_mistakes_are_named() {
    let object = Object::new("reg", 128);
    let shm = on(ByteBudget::new(1 << 20));
    let e = shm
        .register("r", "/sluice-no-such-object", 0, 8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot map key '/sluice-no-such-object'"), "{e}");
    let e = shm.register("r", object.key(), 100, 64).unwrap_err().to_string();
    assert!(e.contains("holds only 128 bytes"), "{e}");
    shm.register("r", object.key(), 0, 64).unwrap();
    let e = shm.register("r", object.key(), 0, 64).unwrap_err().to_string();
    assert!(e.contains("already registered"), "{e}");
    assert!(shm.status(Some("other")).is_err());
    let off = SharedMemory::new(
        &crate::config::SharedMemoryConfig::default(),
        ByteBudget::new(1 << 20),
    );
    let e = off.register("r", object.key(), 0, 64).unwrap_err().to_string();
    assert!(e.contains("shared_memory.enabled = false"), "{e}");
    assert!(e.contains("[shared_memory] enabled = true"), "{e}");
}

#[test]
fn a_region_unregistered_in_use_stays_mapped_for_its_user() {
    let object = Object::new("use", 64);
    let shm = on(ByteBudget::new(1 << 20));
    shm.register("r", object.key(), 0, 64).unwrap();
    shm.write(&at("r", 0, 4), &TensorData::I32(vec![7]), "output `y`")
        .unwrap();
    let r = &at("r", 0, 4);
    // The unregister lands while a request is reading: that read finishes.
    let data = shm
        .read(r, "input `x`", &mut |b| {
            shm.unregister(None);
            Ok(TensorData::I32(vec![i32::from_le_bytes(b.try_into().unwrap())]))
        })
        .unwrap();
    assert_eq!(data, TensorData::I32(vec![7]));
    assert!(shm.status(None).unwrap().is_empty());
    assert!(read_i32(&shm, r).is_err());
}

#[test]
fn an_input_in_shared_memory_is_held_in_the_byte_budget_while_copied() {
    let object = Object::new("budget", 4096);
    let budget = ByteBudget::new(1000);
    let shm = on(budget.clone());
    shm.register("r", object.key(), 0, 4096).unwrap();
    // Other requests hold most of the budget: a 64-byte read still fits, 800 does not.
    let _others = budget.reserve(900).unwrap();
    assert!(read_i32(&shm, &at("r", 0, 64)).is_ok());
    let e = read_i32(&shm, &at("r", 0, 800)).unwrap_err();
    assert!(matches!(e, Error::Busy { .. }), "{e}");
}

#[test]
fn an_object_shrunk_under_a_registered_region_is_an_error_for_that_request_not_a_crash() {
    let object = Object::new("shrink", 1 << 20);
    let shm = on(ByteBudget::new(4 << 20));
    shm.register("r", object.key(), 4096, 8192).unwrap();
    shm.write(&at("r", 0, 8), &TensorData::I32(vec![5, 6]), "output `y`")
        .unwrap();
    assert_eq!(
        read_i32(&shm, &at("r", 0, 8)).unwrap(),
        TensorData::I32(vec![5, 6])
    );
    // The client truncates its object to nothing, then to less than the region.
    for len in [0, 4096 + 100] {
        let fd = unsafe { libc::shm_open(object.0.as_ptr(), libc::O_RDWR, 0) };
        assert!(fd >= 0);
        assert_eq!(unsafe { libc::ftruncate(fd, len) }, 0);
        unsafe { libc::close(fd) };
        let e = read_i32(&shm, &at("r", 0, 8192)).unwrap_err().to_string();
        assert!(e.contains("input `x`") && e.contains("the object shrank"), "{e}");
        assert!(e.contains(&format!("holds only {len} bytes")), "{e}");
        let e = shm
            .write(&at("r", 200, 8), &TensorData::I32(vec![1, 2]), "output `y`")
            .unwrap_err()
            .to_string();
        assert!(e.contains("output `y`") && e.contains("the object shrank"), "{e}");
    }
    // What still lies inside the object is read as before.
    assert_eq!(
        read_i32(&shm, &at("r", 0, 8)).unwrap(),
        TensorData::I32(vec![0, 0])
    );
}

#[test]
fn registrations_stop_at_max_regions_and_a_freed_slot_can_be_used_again() {
    let object = Object::new("many", 4096);
    let cfg = crate::config::SharedMemoryConfig {
        enabled: true,
        max_regions: 3,
    };
    let shm = SharedMemory::new(&cfg, ByteBudget::new(1 << 20));
    for i in 0..3 {
        shm.register(&format!("r{i}"), object.key(), 0, 4096).unwrap();
    }
    let e = shm.register("r3", object.key(), 0, 4096).unwrap_err().to_string();
    assert!(
        e.contains("3 regions are registered") && e.contains("shared_memory.max_regions"),
        "{e}"
    );
    shm.unregister(Some("r0"));
    shm.register("r3", object.key(), 0, 4096).unwrap();
    assert_eq!(shm.status(None).unwrap().len(), 3);
}
