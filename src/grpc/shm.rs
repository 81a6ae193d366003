//! Triton's shared-memory calls over gRPC, one call each into the region
//! registry (`crate::shm`); the service's trait methods delegate here.

use std::collections::HashMap;

use crate::error::Error;
use crate::protocol::grpc::inference::{
    cuda_shared_memory_status_response, system_shared_memory_status_response, CudaSharedMemoryStatusResponse,
    SystemSharedMemoryRegisterRequest, SystemSharedMemoryRegisterResponse, SystemSharedMemoryStatusResponse,
};
use crate::protocol::grpc::non_empty;
use crate::shm::SharedMemory;

/// The status of region `name` (empty: every region).
pub fn status(shm: &SharedMemory, name: &str) -> Result<SystemSharedMemoryStatusResponse, Error> {
    let regions = shm
        .status(non_empty(name))?
        .into_iter()
        .map(|r| {
            let status = system_shared_memory_status_response::RegionStatus {
                name: r.name.clone(),
                key: r.key,
                offset: r.offset as u64,
                byte_size: r.byte_size as u64,
            };
            (r.name, status)
        })
        .collect();
    Ok(SystemSharedMemoryStatusResponse { regions })
}

pub fn register(
    shm: &SharedMemory,
    req: SystemSharedMemoryRegisterRequest,
) -> Result<SystemSharedMemoryRegisterResponse, Error> {
    let size = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    shm.register(&req.name, &req.key, size(req.offset), size(req.byte_size))?;
    Ok(SystemSharedMemoryRegisterResponse {})
}

/// No CUDA region is ever registered.
pub fn cuda_status(name: &str) -> Result<CudaSharedMemoryStatusResponse, Error> {
    match non_empty(name) {
        None => Ok(CudaSharedMemoryStatusResponse {
            regions: HashMap::<String, cuda_shared_memory_status_response::RegionStatus>::new(),
        }),
        Some(n) => Err(crate::shm::cuda_not_found(n)),
    }
}
