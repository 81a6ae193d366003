//! Triton's system shared-memory extension: the regions clients register
//! (a POSIX shared-memory object, `shm_open(key)`, mapped from `offset` for
//! `byte_size` bytes), read for inputs and written for outputs that name
//! them. One registry per server, shared by both ports; handlers hold a
//! region's `Arc` while they use it, so a region unregistered during a
//! request stays mapped until that request is done with it. CUDA shared
//! memory is refused until a GPU path can test it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use crate::budget::ByteBudget;
use crate::error::Error;
use crate::protocol::shm::{not_registered, Regions, ShmRef};
use crate::tensor::TensorData;

/// One registered region, mapped.
pub struct Region {
    pub name: String,
    pub key: String,
    pub offset: usize,
    pub byte_size: usize,
    map: Mapping,
}

/// A shared mapping of `len` bytes at `ptr`, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access copies bytes in or
// out with `ptr::copy_nonoverlapping` within `len`, never through references
// that another process's writes could invalidate.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are what `mmap` returned and was asked for.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Region {
    /// Opens and maps `key` from `offset` for `byte_size` bytes. The error
    /// names the key and what the system said.
    fn map(name: &str, key: &str, offset: usize, byte_size: usize) -> Result<Region, Error> {
        let fail = |why: String| {
            Error::invalid(format!(
                "shared memory region '{name}': cannot map key '{key}' (offset {offset}, byte_size {byte_size}): {why}"
            ))
        };
        if byte_size == 0 {
            return Err(fail("byte_size must be more than 0".into()));
        }
        let c_key = std::ffi::CString::new(key).map_err(|_| fail("the key holds a NUL byte".into()))?;
        // SAFETY: a valid C string; the descriptor is closed below.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(fail(std::io::Error::last_os_error().to_string()));
        }
        let result = map_fd(fd, offset, byte_size);
        // SAFETY: `fd` is ours; a mapping outlives its descriptor.
        unsafe { libc::close(fd) };
        let (ptr, len) = result.map_err(fail)?;
        Ok(Region {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
            map: Mapping { ptr, len },
        })
    }

    /// Where `at` is in the mapping, checked against the region's size.
    fn range(&self, at: &ShmRef, bytes: usize, what: &str) -> Result<*mut u8, Error> {
        let end = at.offset.checked_add(bytes);
        if end.is_none_or(|end| end > self.byte_size) {
            return Err(Error::invalid(format!(
                "{what}: {bytes} bytes at offset {} do not fit shared memory region '{}' of {} bytes",
                at.offset, self.name, self.byte_size
            )));
        }
        // The region starts `offset` bytes into the mapping (page-aligned below it).
        let start = self.map.len - self.byte_size + at.offset;
        // SAFETY: `start + bytes <= map.len`, checked above.
        Ok(unsafe { self.map.ptr.add(start) })
    }
}

/// Maps `byte_size` bytes of `fd` from `offset`, from the page boundary below
/// it: (start of the mapping, its length).
fn map_fd(fd: i32, offset: usize, byte_size: usize) -> Result<(*mut u8, usize), String> {
    // SAFETY: fstat on a descriptor we hold into a zeroed struct.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    let object = usize::try_from(stat.st_size).unwrap_or(0);
    if offset.checked_add(byte_size).is_none_or(|end| end > object) {
        return Err(format!("the shared memory object holds only {object} bytes"));
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let aligned = offset / page * page;
    let len = byte_size + (offset - aligned);
    // SAFETY: a fresh shared mapping of a range checked to lie inside the object.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            aligned as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok((ptr.cast(), len))
}

/// The server's registered regions.
pub struct SharedMemory {
    /// `shared_memory.enabled`: off, every register is refused.
    enabled: bool,
    /// The server's byte budget: an input's bytes are reserved in it before
    /// they are copied out of a region.
    budget: ByteBudget,
    /// Written by register/unregister; read by every request naming a
    /// region (a lookup and an `Arc` clone under the lock, never an await).
    regions: RwLock<BTreeMap<String, Arc<Region>>>,
}

/// A region's status, as both protocols report it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Status {
    pub name: String,
    pub key: String,
    pub offset: usize,
    pub byte_size: usize,
}

impl SharedMemory {
    pub fn new(enabled: bool, budget: ByteBudget) -> SharedMemory {
        SharedMemory {
            enabled,
            budget,
            regions: RwLock::new(BTreeMap::new()),
        }
    }

    /// Registers region `name`: `byte_size` bytes of `key` from `offset`.
    pub fn register(&self, name: &str, key: &str, offset: usize, byte_size: usize) -> Result<(), Error> {
        if !self.enabled {
            return Err(Error::invalid(format!(
                "shared memory region '{}': system shared memory is turned off on this server \
                 (`shared_memory.enabled = false`); send tensor data in the request",
                crate::error::clip(name)
            )));
        }
        if name.is_empty() {
            return Err(Error::invalid("a shared memory region needs a name".to_string()));
        }
        if self.regions.read().expect("shm lock poisoned").contains_key(name) {
            return Err(Error::invalid(format!(
                "shared memory region '{}' is already registered; unregister it first",
                crate::error::clip(name)
            )));
        }
        let region = Arc::new(Region::map(name, key, offset, byte_size)?);
        tracing::info!(region = %name, key = %key, offset, byte_size, "shared memory region registered");
        let mut regions = self.regions.write().expect("shm lock poisoned");
        if regions.contains_key(name) {
            return Err(Error::invalid(format!(
                "shared memory region '{}' is already registered; unregister it first",
                crate::error::clip(name)
            )));
        }
        regions.insert(name.to_string(), region);
        Ok(())
    }

    /// Unregisters region `name`, or every region (`None`). Unknown names
    /// are not an error (Triton's answer). Requests using it finish first.
    pub fn unregister(&self, name: Option<&str>) {
        let mut regions = self.regions.write().expect("shm lock poisoned");
        match name {
            Some(n) => {
                regions.remove(n);
            }
            None => regions.clear(),
        }
    }

    /// The status of region `name`, or of every region.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<Status>, Error> {
        let regions = self.regions.read().expect("shm lock poisoned");
        let of = |r: &Region| Status {
            name: r.name.clone(),
            key: r.key.clone(),
            offset: r.offset,
            byte_size: r.byte_size,
        };
        match name {
            None => Ok(regions.values().map(|r| of(r)).collect()),
            Some(n) => regions.get(n).map(|r| vec![of(r)]).ok_or_else(|| {
                Error::NotFound(format!(
                    "Unable to find system shared memory region: '{}'",
                    crate::error::clip(n)
                ))
            }),
        }
    }

    fn get(&self, region: &str, what: &str) -> Result<Arc<Region>, Error> {
        let regions = self.regions.read().expect("shm lock poisoned");
        regions
            .get(region)
            .cloned()
            .ok_or_else(|| not_registered(region, what))
    }

    /// Writes the outputs of `resp` that its request asked to have in a
    /// region (`in_shm`, by output name).
    pub fn write_outputs(
        &self,
        resp: &crate::protocol::InferResponse,
        in_shm: &std::collections::HashMap<String, ShmRef>,
    ) -> Result<(), Error> {
        for t in &resp.outputs {
            if let Some(at) = in_shm.get(&t.name) {
                self.write(at, &t.data, &format!("output `{}`", t.name))?;
            }
        }
        Ok(())
    }

    /// Writes `data` (raw, as the binary extension encodes it) at `at`; the
    /// error names the output when it does not fit.
    pub fn write(&self, at: &ShmRef, data: &TensorData, what: &str) -> Result<(), Error> {
        let region = self.get(&at.region, what)?;
        let bytes = crate::protocol::binary::encode(data);
        if bytes.len() > at.byte_size {
            return Err(Error::invalid(format!(
                "{what}: {} bytes of output do not fit its `shared_memory_byte_size` of {}",
                bytes.len(),
                at.byte_size
            )));
        }
        let dst = region.range(at, bytes.len(), what)?;
        // SAFETY: `dst` has room for `bytes.len()` bytes (checked by `range`).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, bytes.len()) };
        Ok(())
    }
}

impl Regions for SharedMemory {
    fn read(
        &self,
        at: &ShmRef,
        what: &str,
        decode: &mut dyn FnMut(&[u8]) -> Result<TensorData, Error>,
    ) -> Result<TensorData, Error> {
        let region = self.get(&at.region, what)?;
        let src = region.range(at, at.byte_size, what)?;
        // Held until decoded; the decoded tensor is then reserved by the caller.
        let _copy = self.budget.reserve(at.byte_size)?;
        // Copied out first: the client may write the region while it is read.
        let mut bytes = vec![0u8; at.byte_size];
        // SAFETY: `src` holds `byte_size` bytes (checked by `range`).
        unsafe { std::ptr::copy_nonoverlapping(src, bytes.as_mut_ptr(), at.byte_size) };
        decode(&bytes)
    }
}

/// The answer for the status of CUDA region `name`: none is ever registered.
pub fn cuda_not_found(name: &str) -> Error {
    Error::NotFound(format!(
        "Unable to find cuda shared memory region: '{}'",
        crate::error::clip(name)
    ))
}

/// The refusal of a CUDA shared-memory registration.
pub fn cuda_refused(name: &str) -> Error {
    Error::invalid(format!(
        "CUDA shared memory region '{}': CUDA shared memory is not supported yet; \
         use system shared memory or send tensor data in the request",
        crate::error::clip(name)
    ))
}

#[cfg(test)]
mod tests;
