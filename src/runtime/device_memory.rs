//! Bytes in use on each CUDA device, from the CUDA runtime's
//! `cudaMemGetInfo`, loaded with `dlopen` (the CPU build needs no CUDA).
//! The repository reads it before and after a model loads to attribute
//! device memory to that model (`sluice_model_memory_bytes`, README "Metrics").

use std::sync::OnceLock;

type GetDeviceCount = unsafe extern "C" fn(*mut i32) -> i32;
type SetDevice = unsafe extern "C" fn(i32) -> i32;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> i32;

/// The three CUDA runtime functions, with the library that holds them.
struct Cudart {
    _lib: libloading::Library,
    device_count: GetDeviceCount,
    set_device: SetDevice,
    mem_get_info: MemGetInfo,
}

/// Loaded on first use; `None` where no CUDA runtime can be loaded.
static CUDART: OnceLock<Option<Cudart>> = OnceLock::new();

/// The CUDA runtime's names: CUDA 13 (what `onnxruntime-gpu` 1.31 links), then 12.
const NAMES: [&str; 3] = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"];

fn cudart() -> Option<&'static Cudart> {
    CUDART
        .get_or_init(|| NAMES.iter().find_map(|name| open(name)))
        .as_ref()
}

fn open(name: &str) -> Option<Cudart> {
    // SAFETY: loading the CUDA runtime runs its initialisers, which have no
    // preconditions; the symbols are looked up with their documented C types.
    unsafe {
        let lib = libloading::Library::new(name).ok()?;
        let device_count = *lib.get::<GetDeviceCount>(b"cudaGetDeviceCount\0").ok()?;
        let set_device = *lib.get::<SetDevice>(b"cudaSetDevice\0").ok()?;
        let mem_get_info = *lib.get::<MemGetInfo>(b"cudaMemGetInfo\0").ok()?;
        Some(Cudart {
            _lib: lib,
            device_count,
            set_device,
            mem_get_info,
        })
    }
}

/// Bytes in use on every CUDA device (total minus free, all processes'),
/// indexed by device id; empty without a CUDA runtime or device. Blocking
/// (the first call initialises CUDA): call it where a model loads.
pub fn used_per_device() -> Vec<u64> {
    info_per_device()
        .into_iter()
        .map(|(free, total)| total.saturating_sub(free))
        .collect()
}

/// Each CUDA device's total memory, indexed by device id; empty without a
/// CUDA runtime or device. Blocking, as [`used_per_device`].
pub fn total_per_device() -> Vec<u64> {
    info_per_device().into_iter().map(|(_, total)| total).collect()
}

/// (free, total) bytes of every CUDA device.
fn info_per_device() -> Vec<(u64, u64)> {
    let Some(c) = cudart() else { return Vec::new() };
    let mut n = 0i32;
    // SAFETY: the functions are the CUDA runtime's, called with valid pointers.
    unsafe {
        if (c.device_count)(&mut n) != 0 {
            return Vec::new();
        }
        (0..n)
            .map(|id| {
                let (mut free, mut total) = (0usize, 0usize);
                match (c.set_device)(id) == 0 && (c.mem_get_info)(&mut free, &mut total) == 0 {
                    true => (free as u64, total as u64),
                    false => (0, 0),
                }
            })
            .collect()
    }
}

/// Growth of each device's use between two readings of [`used_per_device`],
/// for the devices in `on` (a model's sessions' devices): (device, bytes).
pub fn growth(before: &[u64], after: &[u64], on: &[u32]) -> Vec<(u32, u64)> {
    let mut ids: Vec<u32> = on.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .filter_map(|id| {
            let i = id as usize;
            Some((id, after.get(i)?.saturating_sub(*before.get(i)?)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_per_device_of_the_sessions_and_never_negative() {
        let before = [1000, 5000];
        let after = [1700, 4000];
        assert_eq!(growth(&before, &after, &[0, 0]), [(0, 700)]);
        assert_eq!(growth(&before, &after, &[1, 0]), [(0, 700), (1, 0)]);
        // A device the first reading did not see is not attributed.
        assert_eq!(growth(&before[..1], &after, &[1]), []);
        assert!(growth(&[], &[], &[0]).is_empty());
    }
}
