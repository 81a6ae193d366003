//! Triton's system shared-memory extension: the regions clients register
//! (a POSIX shared-memory object, `shm_open(key)`, from `offset` for
//! `byte_size` bytes), read for inputs and written for outputs that name
//! them. One registry per server, shared by both ports; handlers hold a
//! region's `Arc` while they use it, so a region unregistered during a
//! request stays open until that request is done with it. CUDA shared
//! memory is refused until a GPU path can test it.
//!
//! A region is read and written through its descriptor (`pread`/`pwrite`),
//! never through a mapping: the client owns the object and may shrink it at
//! any time, and a mapping past the end of a shrunk object is a SIGBUS for
//! the whole process, where a short read is an error for one request.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, RwLock};

use crate::budget::ByteBudget;
use crate::error::Error;
use crate::protocol::shm::{not_registered, Regions, ShmRef};
use crate::tensor::TensorData;

/// One registered region, its object held open.
pub struct Region {
    pub name: String,
    pub key: String,
    pub offset: usize,
    pub byte_size: usize,
    file: File,
}

impl Region {
    /// Opens `key` and checks that it holds `byte_size` bytes from `offset`.
    /// The error names the key and what the system said.
    fn open(name: &str, key: &str, offset: usize, byte_size: usize) -> Result<Region, Error> {
        let fail = |why: String| {
            Error::invalid(format!(
                "shared memory region '{}': cannot map key '{}' (offset {offset}, byte_size {byte_size}): {why}",
                crate::error::clip(name),
                crate::error::clip(key)
            ))
        };
        if byte_size == 0 {
            return Err(fail("byte_size must be more than 0".into()));
        }
        let c_key = std::ffi::CString::new(key).map_err(|_| fail("the key holds a NUL byte".into()))?;
        // SAFETY: a valid C string; the descriptor is owned by `file` below.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if fd < 0 {
            return Err(fail(std::io::Error::last_os_error().to_string()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let region = Region {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
            file,
        };
        region.holds(0, byte_size).map_err(fail)?;
        Ok(region)
    }

    /// Whether the object still holds `bytes` bytes at `at` of the region:
    /// the client may have shrunk it since it was registered.
    fn holds(&self, at: usize, bytes: usize) -> Result<(), String> {
        let object = self.file.metadata().map_err(|e| e.to_string())?.len();
        let end = self.offset as u64 + at as u64 + bytes as u64;
        match end <= object {
            true => Ok(()),
            false => Err(format!("the shared memory object holds only {object} bytes")),
        }
    }

    /// Checks `bytes` at `at.offset` against the region's size and the
    /// object's: where in the object they start.
    fn range(&self, at: &ShmRef, bytes: usize, what: &str) -> Result<u64, Error> {
        let end = at.offset.checked_add(bytes);
        if end.is_none_or(|end| end > self.byte_size) {
            return Err(Error::invalid(format!(
                "{what}: {bytes} bytes at offset {} do not fit shared memory region '{}' of {} bytes",
                at.offset, self.name, self.byte_size
            )));
        }
        self.holds(at.offset, bytes)
            .map_err(|why| self.shrunk(what, &why))?;
        Ok((self.offset + at.offset) as u64)
    }

    /// The error for a region whose object changed under the server.
    fn shrunk(&self, what: &str, why: &str) -> Error {
        Error::invalid(format!(
            "{what}: shared memory region '{}' (key '{}', offset {}, byte_size {}) can no longer be read or written: \
             {why}; the object shrank after it was registered. Unregister it and register it again",
            self.name,
            crate::error::clip(&self.key),
            self.offset,
            self.byte_size
        ))
    }
}

/// The server's registered regions.
pub struct SharedMemory {
    /// `shared_memory.enabled`: off, every register is refused.
    enabled: bool,
    /// `shared_memory.max_regions`: the most registered at once.
    max_regions: usize,
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
    pub fn new(cfg: &crate::config::SharedMemoryConfig, budget: ByteBudget) -> SharedMemory {
        SharedMemory {
            enabled: cfg.enabled,
            max_regions: cfg.max_regions,
            budget,
            regions: RwLock::new(BTreeMap::new()),
        }
    }

    /// Registers region `name`: `byte_size` bytes of `key` from `offset`.
    pub fn register(&self, name: &str, key: &str, offset: usize, byte_size: usize) -> Result<(), Error> {
        if !self.enabled {
            return Err(Error::invalid(format!(
                "shared memory region '{}': system shared memory is turned off on this server \
                 (`shared_memory.enabled = false`, the default: a client that may register regions can read and \
                 write any shared memory object the server's user can open); send tensor data in the request, \
                 or ask the operator to set `[shared_memory] enabled = true` (SLUICE_SHARED_MEMORY__ENABLED=true)",
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
        let region = Arc::new(Region::open(name, key, offset, byte_size)?);
        let mut regions = self.regions.write().expect("shm lock poisoned");
        if regions.contains_key(name) {
            return Err(Error::invalid(format!(
                "shared memory region '{}' is already registered; unregister it first",
                crate::error::clip(name)
            )));
        }
        if regions.len() >= self.max_regions {
            return Err(Error::invalid(format!(
                "shared memory region '{}': {} regions are registered, the most this server holds \
                 (`shared_memory.max_regions`); unregister one first",
                crate::error::clip(name),
                regions.len()
            )));
        }
        tracing::debug!(region = %name, key = %key, offset, byte_size, "shared memory region registered");
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
        let from = region.range(at, bytes.len(), what)?;
        // A shrink after `range`'s check makes the write extend the object
        // again: the client's doing, and harmless to the server.
        region
            .file
            .write_all_at(&bytes, from)
            .map_err(|e| region.shrunk(what, &e.to_string()))
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
        let from = region.range(at, at.byte_size, what)?;
        // Held until decoded; the decoded tensor is then reserved by the caller.
        let _copy = self.budget.reserve(at.byte_size)?;
        // Copied out first: the client may write the region while it is read.
        let mut bytes = vec![0u8; at.byte_size];
        region
            .file
            .read_exact_at(&mut bytes, from)
            .map_err(|e| region.shrunk(what, &e.to_string()))?;
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
