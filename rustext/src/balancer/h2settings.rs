//! Sans-I/O reader of a backend's first HTTP/2 SETTINGS frame, for its
//! `SETTINGS_MAX_CONCURRENT_STREAMS` (hyper's client honours the limit by
//! queueing streams but does not tell it; the pool wants it to know when a
//! connection is full and another one should be opened).
//!
//! A server's connection preface is a SETTINGS frame (RFC 9113 §3.4), so the
//! first frame read on a backend connection is the one: [`Sniffer::feed`]
//! takes the bytes as they are read, checks the 9-byte frame header before
//! looking at the payload, and stops at the end of that first frame. It
//! never buffers: a setting split across reads is carried in a few bytes of
//! state. Later SETTINGS frames (a limit changed mid-connection) are not
//! followed; hyper still respects them.

/// The identifier of `SETTINGS_MAX_CONCURRENT_STREAMS` (RFC 9113 §6.5.2).
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
const FRAME_SETTINGS: u8 = 0x4;
const FLAG_ACK: u8 = 0x1;

/// What the first frame told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// More bytes are needed.
    Incomplete,
    /// The frame is over: the limit it set, if it set one.
    Done(Option<u32>),
}

/// State of the reader (see the module doc).
#[derive(Debug, Default)]
pub struct Sniffer {
    /// Bytes of the frame header read so far.
    header: [u8; 9],
    header_len: u8,
    /// Payload bytes still to read (valid once the header is complete).
    left: u32,
    /// The setting being read (6 bytes: id, value).
    entry: [u8; 6],
    entry_len: u8,
    found: Option<u32>,
    done: bool,
}

impl Sniffer {
    /// Feed the next bytes read from the backend.
    pub fn feed(&mut self, mut data: &[u8]) -> Sniffed {
        if self.done {
            return Sniffed::Done(self.found);
        }
        while (self.header_len as usize) < self.header.len() {
            let Some((&b, rest)) = data.split_first() else { return Sniffed::Incomplete };
            self.header[self.header_len as usize] = b;
            self.header_len += 1;
            data = rest;
            if self.header_len as usize == self.header.len() {
                let h = &self.header;
                let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                let (kind, flags) = (h[3], h[4]);
                if kind != FRAME_SETTINGS || flags & FLAG_ACK != 0 || !len.is_multiple_of(6) {
                    // not a server preface: hyper will find out; nothing learnt here
                    return self.finish();
                }
                self.left = len;
            }
        }
        while self.left > 0 {
            let Some((&b, rest)) = data.split_first() else { return Sniffed::Incomplete };
            data = rest;
            self.left -= 1;
            self.entry[self.entry_len as usize] = b;
            self.entry_len += 1;
            if self.entry_len == 6 {
                self.entry_len = 0;
                let id = u16::from_be_bytes([self.entry[0], self.entry[1]]);
                if id == MAX_CONCURRENT_STREAMS {
                    let e = &self.entry;
                    self.found = Some(u32::from_be_bytes([e[2], e[3], e[4], e[5]]));
                }
            }
        }
        self.finish()
    }

    fn finish(&mut self) -> Sniffed {
        self.done = true;
        Sniffed::Done(self.found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
        let len = (entries.len() * 6) as u32;
        let mut v = len.to_be_bytes()[1..].to_vec();
        v.extend_from_slice(&[FRAME_SETTINGS, 0, 0, 0, 0, 0]);
        for (id, val) in entries {
            v.extend_from_slice(&id.to_be_bytes());
            v.extend_from_slice(&val.to_be_bytes());
        }
        v
    }

    #[test]
    fn reads_the_limit_of_the_first_settings_frame() {
        let f = settings(&[(0x4, 65535), (0x3, 10), (0x5, 16384)]);
        assert_eq!(Sniffer::default().feed(&f), Sniffed::Done(Some(10)));
        assert_eq!(Sniffer::default().feed(&settings(&[(0x4, 1)])), Sniffed::Done(None));
        assert_eq!(Sniffer::default().feed(&settings(&[])), Sniffed::Done(None));
    }

    #[test]
    fn other_frames_teach_nothing() {
        let mut ack = settings(&[]);
        ack[4] = FLAG_ACK;
        assert_eq!(Sniffer::default().feed(&ack), Sniffed::Done(None));
        let mut ping = vec![0, 0, 8, 6, 0, 0, 0, 0, 0];
        ping.extend_from_slice(&[0; 8]);
        assert_eq!(Sniffer::default().feed(&ping), Sniffed::Done(None));
        // an HTTP/1 answer from a backend that does not speak h2
        assert_eq!(Sniffer::default().feed(b"HTTP/1.1 400 Bad Request\r\n"), Sniffed::Done(None));
    }

    proptest! {
        #[test]
        fn any_split_gives_the_same_answer(cut in proptest::collection::vec(0usize..40, 0..6), limit: u32) {
            let mut f = settings(&[(0x2, 0), (0x3, limit), (0x6, 8192)]);
            f.extend_from_slice(b"trailing frames");
            let mut s = Sniffer::default();
            let mut at = 0;
            let mut got = Sniffed::Incomplete;
            for c in cut.into_iter().chain([f.len()]) {
                let end = (at + c).min(f.len());
                got = s.feed(&f[at..end]);
                at = end;
            }
            prop_assert_eq!(got, Sniffed::Done(Some(limit)));
        }

        #[test]
        fn hostile_bytes_never_panic(data: Vec<u8>) {
            let mut s = Sniffer::default();
            for chunk in data.chunks(7) {
                let _ = s.feed(chunk);
            }
        }
    }
}
