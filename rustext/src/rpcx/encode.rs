//! Encoding rpcx frames into a growing buffer or a preallocated slice.

use std::io::Write;

use super::*;

pub(super) fn gzip(payload: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(payload.len() / 2 + 64), flate2::Compression::fast());
    enc.write_all(payload).expect("writing to a Vec cannot fail");
    enc.finish().expect("writing to a Vec cannot fail")
}

/// Where an encoder writes: a growing `Vec` or a preallocated slice.
pub trait Sink {
    fn put(&mut self, b: &[u8]);
}

impl Sink for Vec<u8> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// A slice filled front to back (its length must be the frame's exact size).
pub struct SliceSink<'a> {
    pub buf: &'a mut [u8],
    pub pos: usize,
}

impl Sink for SliceSink<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
}

fn check_u32(n: usize, what: &str) -> Result<(), RpcxError> {
    if n > u32::MAX as usize {
        return Err(RpcxError::Invalid(format!("{what} longer than 4 GiB")));
    }
    Ok(())
}

/// Size of the whole frame whose (already compressed, if gzip) payload has
/// `wire_len` bytes; validates the header and every length field.
pub fn frame_size<K: AsRef<str>, V: AsRef<str>>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    wire_len: usize,
) -> Result<usize, RpcxError> {
    header.validate()?;
    check_u32(service_path.len(), "service path")?;
    check_u32(service_method.len(), "service method")?;
    let mut meta_len = 0usize;
    for (k, v) in metadata {
        check_u32(k.as_ref().len(), "metadata key")?;
        check_u32(v.as_ref().len(), "metadata value")?;
        meta_len += 8 + k.as_ref().len() + v.as_ref().len();
    }
    check_u32(meta_len, "metadata")?;
    check_u32(wire_len, "payload")?;
    let total = 16 + service_path.len() + service_method.len() + meta_len + wire_len;
    check_u32(total, "message")?;
    Ok(HEADER_LEN + total)
}

/// Write a frame whose size `frame_size` accepted (`size` is its result).
pub fn write_frame<K: AsRef<str>, V: AsRef<str>, S: Sink>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    wire: &[u8],
    size: usize,
    out: &mut S,
) {
    let meta_len: usize = metadata.iter().map(|(k, v)| 8 + k.as_ref().len() + v.as_ref().len()).sum();
    let mut b2 = (header.compress << 2) | header.status;
    if header.response {
        b2 |= 0x80;
    }
    if header.heartbeat {
        b2 |= 0x40;
    }
    if header.oneway {
        b2 |= 0x20;
    }
    out.put(&[MAGIC, 0, b2, header.serialize << 4]);
    out.put(&header.seq.to_be_bytes());
    let be = |n: usize| (n as u32).to_be_bytes();
    out.put(&be(size - HEADER_LEN));
    out.put(&be(service_path.len()));
    out.put(service_path.as_bytes());
    out.put(&be(service_method.len()));
    out.put(service_method.as_bytes());
    out.put(&be(meta_len));
    for (k, v) in metadata {
        let (k, v) = (k.as_ref(), v.as_ref());
        out.put(&be(k.len()));
        out.put(k.as_bytes());
        out.put(&be(v.len()));
        out.put(v.as_bytes());
    }
    out.put(&be(wire.len()));
    out.put(wire);
}

/// Append one frame to `out` (on error `out` is left as it was).
pub fn encode_into<K: AsRef<str>, V: AsRef<str>>(
    header: &Header,
    service_path: &str,
    service_method: &str,
    metadata: &[(K, V)],
    payload: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), RpcxError> {
    header.validate()?;
    let compressed;
    let wire: &[u8] = if header.compress == COMPRESS_GZIP {
        compressed = gzip(payload);
        &compressed
    } else {
        payload
    };
    let size = frame_size(header, service_path, service_method, metadata, wire.len())?;
    out.reserve(size);
    write_frame(header, service_path, service_method, metadata, wire, size, out);
    Ok(())
}

impl Message {
    pub fn encode(&self) -> Result<Vec<u8>, RpcxError> {
        let mut out = Vec::new();
        encode_into(&self.header, &self.service_path, &self.service_method, &self.metadata, &self.payload, &mut out)?;
        Ok(out)
    }
}
