//! A byte stream split into rpcx messages (framing + decoding).

use crate::framing::{FeedError, FrameConfig, FrameError, FrameSplitter};

use super::*;

/// Stream decoder: feed read buffers, get whole messages. A bad magic or an
/// over-long length fails as soon as the 1 or 16 bytes that show it arrive.
pub struct Stream {
    limits: Limits,
    splitter: FrameSplitter,
}

impl Stream {
    pub fn new(limits: Limits) -> Self {
        let cfg = FrameConfig {
            offset: 12,
            width: 4,
            max_frame: limits.max_message_len,
            strip_header: false,
            magic: Some(MAGIC),
            ..FrameConfig::default()
        };
        Stream { limits, splitter: FrameSplitter::new(cfg).expect("valid rpcx framing") }
    }

    pub fn buffered(&self) -> usize {
        self.splitter.buffered()
    }

    /// Decode every complete frame of the stream so far, calling `emit` on each.
    pub fn feed<E, F>(&mut self, data: &[u8], mut emit: F) -> Result<(), StreamError<E>>
    where
        F: FnMut(MessageRef<'_>) -> Result<(), E>,
    {
        let limits = self.limits;
        self.splitter
            .feed(data, |frame| match decode_body(frame, &limits) {
                Ok(m) => emit(m).map_err(StreamError::Consumer),
                Err(e) => Err(StreamError::Rpcx(e)),
            })
            .map_err(|e| match e {
                FeedError::Frame(FrameError::TooLarge { len, max }) => {
                    StreamError::Rpcx(RpcxError::TooLong { len: len as usize, max })
                }
                FeedError::Frame(FrameError::BadMagic(b)) => StreamError::Rpcx(RpcxError::BadMagic(b)),
                FeedError::Frame(e) => StreamError::Rpcx(RpcxError::Invalid(e.to_string())),
                FeedError::Consumer(e) => e,
            })
    }
}

/// An error of [`Stream::feed`].
#[derive(Debug, PartialEq, Eq)]
pub enum StreamError<E> {
    Rpcx(RpcxError),
    Consumer(E),
}

