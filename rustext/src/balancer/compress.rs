//! The streaming encoder of a compressed response ([`super::encode`]
//! decides which): bytes in, coded bytes out, with a flush whenever the
//! caller says the backend has nothing more for now. Memory per response
//! is the coder's window and tables plus the output of one flush, never
//! the whole body.

use std::io::Write;

use bytes::Bytes;

use super::encode::Coding;

/// brotli's window: 2^20 bytes (1 MiB) — a bound on memory per response
/// (the default, 2^22, is 4 MiB).
const BROTLI_LGWIN: u32 = 20;
/// zstd's window: 2^20 bytes, the same bound.
const ZSTD_WINDOW_LOG: u32 = 20;

enum Inner {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Br(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

/// One response's encoder.
pub struct Encoder {
    inner: Inner,
    /// Bytes taken in and given out, for the counters.
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Encoder {
    pub fn new(coding: Coding, level: u32) -> std::io::Result<Encoder> {
        let inner = match coding {
            Coding::Gzip => Inner::Gzip(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level.min(9)))),
            Coding::Br => Inner::Br(Box::new(brotli::CompressorWriter::new(Vec::new(), 4096, level.min(11), BROTLI_LGWIN))),
            Coding::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(Vec::new(), level.min(22) as i32)?;
                e.window_log(ZSTD_WINDOW_LOG)?;
                Inner::Zstd(e)
            }
        };
        Ok(Encoder { inner, bytes_in: 0, bytes_out: 0 })
    }

    fn out(&mut self) -> &mut Vec<u8> {
        match &mut self.inner {
            Inner::Gzip(e) => e.get_mut(),
            Inner::Br(e) => e.get_mut(),
            Inner::Zstd(e) => e.get_mut(),
        }
    }

    fn take(&mut self) -> Bytes {
        let b = Bytes::from(std::mem::take(self.out()));
        self.bytes_out += b.len() as u64;
        b
    }

    /// Compress `data`; what is ready may stay buffered until [`Self::flush`].
    pub fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.bytes_in += data.len() as u64;
        match &mut self.inner {
            Inner::Gzip(e) => e.write_all(data),
            Inner::Br(e) => e.write_all(data),
            Inner::Zstd(e) => e.write_all(data),
        }
    }

    /// Bytes of output held (not yet taken).
    pub fn pending(&mut self) -> usize {
        self.out().len()
    }

    /// Everything written so far, decodable by the client now (a sync
    /// flush: server-sent events and streamed responses keep flowing).
    pub fn flush(&mut self) -> std::io::Result<Bytes> {
        match &mut self.inner {
            Inner::Gzip(e) => e.flush()?,
            Inner::Br(e) => e.flush()?,
            Inner::Zstd(e) => e.flush()?,
        }
        Ok(self.take())
    }

    /// The end of the coded stream (trailer, checksum); the encoder is spent.
    pub fn finish(&mut self) -> std::io::Result<Bytes> {
        let inner = std::mem::replace(&mut self.inner, Inner::Gzip(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none())));
        let rest = match inner {
            Inner::Gzip(e) => e.finish()?,
            Inner::Br(mut e) => {
                e.flush()?;
                e.into_inner()
            }
            Inner::Zstd(e) => e.finish()?,
        };
        self.bytes_out += rest.len() as u64;
        Ok(Bytes::from(rest))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn roundtrip(coding: Coding, chunks: &[&[u8]]) -> Vec<u8> {
        let mut e = Encoder::new(coding, 5).unwrap();
        let mut coded = Vec::new();
        for c in chunks {
            e.write(c).unwrap();
            coded.extend_from_slice(&e.flush().unwrap());
        }
        coded.extend_from_slice(&e.finish().unwrap());
        assert_eq!(e.bytes_out, coded.len() as u64);
        let mut plain = Vec::new();
        match coding {
            Coding::Gzip => {
                flate2::read::GzDecoder::new(&coded[..]).read_to_end(&mut plain).unwrap();
            }
            Coding::Br => {
                brotli::Decompressor::new(&coded[..], 4096).read_to_end(&mut plain).unwrap();
            }
            Coding::Zstd => {
                plain = zstd::stream::decode_all(&coded[..]).unwrap();
            }
        }
        plain
    }

    #[test]
    fn every_coding_round_trips() {
        let big = b"the quick brown fox ".repeat(10_000);
        for coding in [Coding::Gzip, Coding::Br, Coding::Zstd] {
            assert_eq!(roundtrip(coding, &[b"hello ", b"", b"world"]), b"hello world");
            assert_eq!(roundtrip(coding, &[&big, &big]).len(), big.len() * 2);
            assert_eq!(roundtrip(coding, &[]), b"");
        }
    }

    #[test]
    fn a_flush_makes_what_was_written_decodable() {
        // the first event of a stream can be read before the stream ends
        let mut e = Encoder::new(Coding::Gzip, 6).unwrap();
        e.write(b"data: 1\n\n").unwrap();
        let first = e.flush().unwrap();
        let mut d = flate2::write::GzDecoder::new(Vec::new());
        d.write_all(&first).unwrap();
        d.flush().unwrap();
        assert_eq!(d.get_ref(), b"data: 1\n\n");
    }
}
