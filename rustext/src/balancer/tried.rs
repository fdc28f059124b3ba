//! The backends a request has tried, by index in its pool: a 128-bit set
//! inline (no allocation for pools of up to 128 servers) and a short list
//! beyond that (a request tries at most `retries + 1 <= 17` backends), so
//! any pool size is right: server 64 is never mistaken for server 0.

/// A set of backend indices (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct Tried {
    low: u128,
    high: Vec<u32>,
}

impl Tried {
    #[inline]
    pub fn contains(&self, i: usize) -> bool {
        if i < 128 {
            self.low & (1u128 << i) != 0
        } else {
            self.high.contains(&(i as u32))
        }
    }

    pub fn insert(&mut self, i: usize) {
        if i < 128 {
            self.low |= 1u128 << i;
        } else if !self.contains(i) {
            self.high.push(i as u32);
        }
    }

    /// A set of the given indices (tests, callers with a fixed list).
    pub fn of(indices: &[usize]) -> Self {
        let mut t = Tried::default();
        for &i in indices {
            t.insert(i);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wrap_at_64_or_128() {
        let mut t = Tried::default();
        t.insert(0);
        assert!(!t.contains(64) && !t.contains(128) && !t.contains(192));
        t.insert(64);
        t.insert(130);
        t.insert(130);
        assert!(t.contains(0) && t.contains(64) && t.contains(130));
        assert!(!t.contains(2) && !t.contains(66) && !t.contains(194));
        assert_eq!(t.high.len(), 1);
        assert!(Tried::of(&[3, 200]).contains(200));
    }
}
