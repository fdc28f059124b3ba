//! Decoding rpcx frames: the header, the body, metadata, gzip payloads.

use std::borrow::Cow;
use std::io::Read;

use super::*;

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u32(&mut self, what: &'static str) -> Result<usize, RpcxError> {
        if self.buf.len() < 4 {
            return Err(RpcxError::BadLength(what));
        }
        let (h, t) = self.buf.split_at(4);
        self.buf = t;
        Ok(u32::from_be_bytes(h.try_into().expect("4 bytes")) as usize)
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], RpcxError> {
        if self.buf.len() < n {
            return Err(RpcxError::BadLength(what));
        }
        let (h, t) = self.buf.split_at(n);
        self.buf = t;
        Ok(h)
    }

    fn string(&mut self, what: &'static str) -> Result<&'a str, RpcxError> {
        let n = self.u32(what)?;
        let b = self.bytes(n, what)?;
        std::str::from_utf8(b).map_err(|_| RpcxError::NotUtf8(what))
    }
}

/// Length of the frame at the start of `buf`, once its 16-byte prefix is
/// there: `Ok(None)` = need more bytes; errors on a bad magic or an over-long
/// total length (before anything past the prefix is read).
pub fn frame_len(buf: &[u8], limits: &Limits) -> Result<Option<usize>, RpcxError> {
    if let Some(&b) = buf.first() {
        if b != MAGIC {
            return Err(RpcxError::BadMagic(b));
        }
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let total = u32::from_be_bytes(buf[12..16].try_into().expect("4 bytes")) as usize;
    if total > limits.max_message_len {
        return Err(RpcxError::TooLong { len: total, max: limits.max_message_len });
    }
    Ok(Some(HEADER_LEN + total))
}

/// Decode exactly one frame (`buf` must hold it and nothing else).
pub fn decode<'a>(buf: &'a [u8], limits: &Limits) -> Result<MessageRef<'a>, RpcxError> {
    if buf.is_empty() {
        return Err(RpcxError::Truncated("header"));
    }
    let Some(len) = frame_len(buf, limits)? else {
        return Err(RpcxError::Truncated(if buf.len() < 12 { "header" } else { "total length" }));
    };
    if buf.len() < len {
        return Err(RpcxError::Truncated("body"));
    }
    if buf.len() > len {
        return Err(RpcxError::Trailing(buf.len() - len));
    }
    decode_body(buf, limits)
}

/// Decode a frame whose length was already checked by [`frame_len`].
pub(crate) fn decode_body<'a>(buf: &'a [u8], limits: &Limits) -> Result<MessageRef<'a>, RpcxError> {
    let header = Header::parse(buf);
    if header.compress > COMPRESS_GZIP {
        return Err(RpcxError::UnsupportedCompressor(header.compress));
    }
    let mut r = Reader { buf: &buf[HEADER_LEN..] };
    let service_path = r.string("service path")?;
    let service_method = r.string("service method")?;
    let meta_len = r.u32("metadata")?;
    let meta = r.bytes(meta_len, "metadata")?;
    let metadata = decode_metadata(meta)?;
    let field = r.u32("payload")?;
    if field != r.buf.len() {
        return Err(RpcxError::PayloadLength { field, actual: r.buf.len() });
    }
    let wire = r.buf;
    let payload = if header.compress == COMPRESS_GZIP {
        Cow::Owned(gunzip(wire, limits.max_decompressed)?)
    } else {
        Cow::Borrowed(wire)
    };
    Ok(MessageRef { header, service_path, service_method, metadata, payload })
}

pub(super) fn decode_metadata(meta: &[u8]) -> Result<Vec<(&str, &str)>, RpcxError> {
    fn take<'a>(m: &mut &'a [u8]) -> Result<&'a str, RpcxError> {
        let all: &'a [u8] = m;
        if all.len() < 4 {
            return Err(RpcxError::Metadata);
        }
        let n = u32::from_be_bytes(all[..4].try_into().expect("4 bytes")) as usize;
        if all.len() - 4 < n {
            return Err(RpcxError::Metadata);
        }
        let s = std::str::from_utf8(&all[4..4 + n]).map_err(|_| RpcxError::NotUtf8("metadata"))?;
        *m = &all[4 + n..];
        Ok(s)
    }
    let mut out: Vec<(&str, &str)> = Vec::new();
    let mut rest = meta;
    while !rest.is_empty() {
        let k = take(&mut rest)?;
        let v = take(&mut rest)?;
        out.push((k, v));
    }
    dedup_last_wins(&mut out);
    Ok(out)
}

/// Keep only the last pair of each key, at its position.
fn dedup_last_wins<K: PartialEq + Copy + std::hash::Hash + Eq, V>(pairs: &mut Vec<(K, V)>) {
    if pairs.len() < 2 {
        return;
    }
    let mut seen = std::collections::HashSet::with_capacity(pairs.len());
    let mut keep = vec![false; pairs.len()];
    for (i, (k, _)) in pairs.iter().enumerate().rev() {
        keep[i] = seen.insert(*k);
    }
    if keep.iter().all(|&k| k) {
        return;
    }
    let mut i = 0;
    pairs.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

fn gunzip(wire: &[u8], max: usize) -> Result<Vec<u8>, RpcxError> {
    let dec = flate2::read::MultiGzDecoder::new(wire);
    let mut out = Vec::with_capacity(wire.len().saturating_mul(4).min(max).min(1 << 20));
    dec.take(max as u64 + 1).read_to_end(&mut out).map_err(|e| RpcxError::Gzip(e.to_string()))?;
    if out.len() > max {
        return Err(RpcxError::DecompressedTooLarge(max));
    }
    Ok(out)
}

