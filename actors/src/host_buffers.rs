//! Moving a rank's results between its backend's buffers and host vectors, for code
//! generic over the backend (the rank's step loop, the MTP step).

use std::any::Any;

use dcpserve_kernels::{Backend, KernelError};

/// `buf` as a host vector: a host-memory backend's `Vec<f32>` is handed over as it is
/// (no copy: the CPU backend's step loop costs what it did before it was generic), any
/// other buffer is downloaded.
pub(crate) fn into_host<B: Backend>(dev: &B, buf: B::Buffer) -> Result<Vec<f32>, KernelError>
where
    B::Buffer: 'static,
{
    let boxed: Box<dyn Any> = Box::new(buf);
    match boxed.downcast::<Vec<f32>>() {
        Ok(v) => Ok(*v),
        Err(other) => match other.downcast::<B::Buffer>() {
            Ok(buf) => {
                let n = dev.len(&buf);
                let mut host = vec![0.0; n];
                dev.download(dev.view(&buf, 0..n)?, &mut host)?;
                Ok(host)
            }
            // The box holds a `B::Buffer`: unreachable, reported rather than unwrapped.
            Err(_) => Err(KernelError::Shape(
                "into_host: buffer of another type".into(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use dcpserve_kernels::{CpuBackend, DeviceMemory};

    #[test]
    fn host_buffers_come_back_unchanged() {
        let dev = CpuBackend::new(1);
        let buf = dev.upload(&[1.0, 2.5, -3.0]).unwrap();
        assert_eq!(super::into_host(&dev, buf).unwrap(), vec![1.0, 2.5, -3.0]);
    }
}
