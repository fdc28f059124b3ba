//! Chunked bodies: the framing written, the framing followed.

use std::io::Write;

/// The chunk framing of `n` data bytes.
pub fn chunk_header(out: &mut Vec<u8>, n: usize) {
    let _ = write!(out, "{n:x}\r\n");
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Size,
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerStart,
    TrailerLine,
    LastLf,
    Done,
}

/// Follows a chunked body: where it ends, and (optionally) its data.
#[derive(Clone, Debug)]
pub struct Chunks {
    st: St,
    size: u64,
    digits: u8,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ChunkError;

impl Default for Chunks {
    fn default() -> Self {
        Chunks {
            st: St::Size,
            size: 0,
            digits: 0,
        }
    }
}

impl Chunks {
    pub fn done(&self) -> bool {
        self.st == St::Done
    }

    /// Consume framing and data from `input` up to the end of the body;
    /// `data` receives the body's bytes. Returns the bytes consumed (less
    /// than `input.len()` only once done).
    pub fn feed(&mut self, input: &[u8], mut data: impl FnMut(&[u8])) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() {
            let c = input[i];
            match self.st {
                St::Size => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if self.digits >= 15 {
                            return Err(ChunkError);
                        }
                        let d = (c as char).to_digit(16).unwrap_or(0) as u64;
                        self.size = self.size * 16 + d;
                        self.digits += 1;
                    }
                    b';' | b' ' | b'\t' if self.digits > 0 => self.st = St::Ext,
                    b'\r' if self.digits > 0 => self.st = St::SizeLf,
                    b'\n' if self.digits > 0 => self.after_size(),
                    _ => return Err(ChunkError),
                },
                St::Ext => match c {
                    b'\r' => self.st = St::SizeLf,
                    b'\n' => self.after_size(),
                    _ => {}
                },
                St::SizeLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.after_size();
                }
                St::Data => {
                    let n = (self.size as usize).min(input.len() - i);
                    data(&input[i..i + n]);
                    self.size -= n as u64;
                    i += n;
                    if self.size == 0 {
                        self.st = St::DataCr;
                    }
                    continue;
                }
                St::DataCr => match c {
                    b'\r' => self.st = St::DataLf,
                    b'\n' => self.st = St::Size,
                    _ => return Err(ChunkError),
                },
                St::DataLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.st = St::Size;
                }
                St::TrailerStart => match c {
                    b'\r' => self.st = St::LastLf,
                    b'\n' => {
                        self.st = St::Done;
                        return Ok(i + 1);
                    }
                    _ => self.st = St::TrailerLine,
                },
                St::TrailerLine => {
                    if c == b'\n' {
                        self.st = St::TrailerStart;
                    }
                }
                St::LastLf => {
                    if c != b'\n' {
                        return Err(ChunkError);
                    }
                    self.st = St::Done;
                    return Ok(i + 1);
                }
                St::Done => return Ok(i),
            }
            i += 1;
        }
        Ok(i)
    }

    fn after_size(&mut self) {
        self.digits = 0;
        self.st = if self.size == 0 {
            St::TrailerStart
        } else {
            St::Data
        };
    }
}
