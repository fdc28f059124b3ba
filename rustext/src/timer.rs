//! Min-heap of deadlines (sans-I/O: the clock is passed in).
//!
//! An indexed binary heap: every entry knows its heap position through a slot
//! table, so `cancel(handle)` removes it in O(log n) with no garbage left
//! behind; `add` is O(log n); `pop_expired(now)` returns every key whose
//! deadline is `<= now`, earliest first (ties in insertion order).
//!
//! Handles are `generation << 32 | slot`: a handle of a fired or cancelled
//! entry never matches a later entry that reuses its slot, so a late
//! `cancel` is a harmless no-op.

/// Opaque handle of an entry.
pub type Handle = u64;

#[derive(Clone, Copy, Debug)]
struct Node {
    deadline: i64,
    seq: u64,
    slot: u32,
}

impl Node {
    #[inline]
    fn before(&self, o: &Node) -> bool {
        (self.deadline, self.seq) < (o.deadline, o.seq)
    }
}

#[derive(Debug)]
struct Slot<K> {
    generation: u32,
    /// Heap index while live.
    pos: usize,
    key: Option<K>,
}

/// The heap. `K` is whatever the caller wants back when a deadline passes.
#[derive(Debug)]
pub struct DeadlineHeap<K> {
    heap: Vec<Node>,
    slots: Vec<Slot<K>>,
    free: Vec<u32>,
    seq: u64,
}

impl<K> Default for DeadlineHeap<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> DeadlineHeap<K> {
    pub fn new() -> Self {
        DeadlineHeap { heap: Vec::new(), slots: Vec::new(), free: Vec::new(), seq: 0 }
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Earliest deadline, if any.
    pub fn next_deadline(&self) -> Option<i64> {
        self.heap.first().map(|n| n.deadline)
    }

    /// Schedule `key` at `deadline`; O(log n).
    pub fn add(&mut self, deadline: i64, key: K) -> Handle {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                assert!(self.slots.len() < u32::MAX as usize, "too many timers");
                self.slots.push(Slot { generation: 0, pos: 0, key: None });
                (self.slots.len() - 1) as u32
            }
        };
        let pos = self.heap.len();
        let s = &mut self.slots[slot as usize];
        s.pos = pos;
        s.key = Some(key);
        let handle = (u64::from(s.generation) << 32) | u64::from(slot);
        self.seq += 1;
        self.heap.push(Node { deadline, seq: self.seq, slot });
        self.sift_up(pos);
        handle
    }

    fn live_slot(&self, handle: Handle) -> Option<u32> {
        let slot = (handle & 0xFFFF_FFFF) as u32;
        let generation = (handle >> 32) as u32;
        let s = self.slots.get(slot as usize)?;
        (s.generation == generation && s.key.is_some()).then_some(slot)
    }

    /// True while `handle` is scheduled.
    pub fn contains(&self, handle: Handle) -> bool {
        self.live_slot(handle).is_some()
    }

    /// Unschedule; returns the key, or None when already fired or cancelled. O(log n).
    pub fn cancel(&mut self, handle: Handle) -> Option<K> {
        let slot = self.live_slot(handle)?;
        let pos = self.slots[slot as usize].pos;
        Some(self.remove_at(pos))
    }

    /// Every key due at `now` (deadline <= now), earliest first.
    pub fn pop_expired(&mut self, now: i64) -> Vec<K> {
        let mut out = Vec::new();
        while let Some(top) = self.heap.first() {
            if top.deadline > now {
                break;
            }
            out.push(self.remove_at(0));
        }
        out
    }

    /// Every scheduled key, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.heap.iter().filter_map(|n| self.slots[n.slot as usize].key.as_ref())
    }

    pub fn clear(&mut self) -> Vec<K> {
        let mut out = Vec::with_capacity(self.heap.len());
        while !self.heap.is_empty() {
            out.push(self.remove_at(0));
        }
        out
    }

    fn remove_at(&mut self, pos: usize) -> K {
        let node = self.heap.swap_remove(pos);
        if pos < self.heap.len() {
            let moved = self.heap[pos].slot;
            self.slots[moved as usize].pos = pos;
            // The moved node may belong above or below `pos`.
            let p = self.sift_up(pos);
            self.sift_down(p);
        }
        let s = &mut self.slots[node.slot as usize];
        s.generation = s.generation.wrapping_add(1);
        let key = s.key.take().expect("live slot");
        self.free.push(node.slot);
        key
    }

    fn sift_up(&mut self, mut pos: usize) -> usize {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.heap[pos].before(&self.heap[parent]) {
                self.swap(pos, parent);
                pos = parent;
            } else {
                break;
            }
        }
        pos
    }

    fn sift_down(&mut self, mut pos: usize) {
        let n = self.heap.len();
        loop {
            let l = 2 * pos + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.heap[r].before(&self.heap[l]) { r } else { l };
            if self.heap[c].before(&self.heap[pos]) {
                self.swap(pos, c);
                pos = c;
            } else {
                break;
            }
        }
    }

    #[inline]
    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        let (sa, sb) = (self.heap[a].slot, self.heap[b].slot);
        self.slots[sa as usize].pos = a;
        self.slots[sb as usize].pos = b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pops_in_order_and_cancels() {
        let mut h = DeadlineHeap::new();
        let a = h.add(30, "a");
        let _b = h.add(10, "b");
        let c = h.add(20, "c");
        let _d = h.add(10, "d");
        assert_eq!(h.next_deadline(), Some(10));
        assert_eq!(h.cancel(c), Some("c"));
        assert_eq!(h.cancel(c), None, "idempotent");
        assert_eq!(h.pop_expired(9), Vec::<&str>::new());
        assert_eq!(h.pop_expired(30), vec!["b", "d", "a"]);
        assert_eq!(h.cancel(a), None, "already fired");
        assert!(h.is_empty());
    }

    #[test]
    fn stale_handle_does_not_cancel_reused_slot() {
        let mut h = DeadlineHeap::new();
        let a = h.add(1, 1);
        assert_eq!(h.pop_expired(1), vec![1]);
        let b = h.add(2, 2);
        assert_ne!(a, b);
        assert_eq!(h.cancel(a), None);
        assert!(h.contains(b));
        assert_eq!(h.len(), 1);
    }

    proptest! {
        #[test]
        fn behaves_like_a_sorted_list(ops in proptest::collection::vec((0u8..3, 0i64..100, any::<usize>()), 0..300)) {
            let mut h = DeadlineHeap::new();
            let mut model: Vec<(i64, u64, usize)> = Vec::new(); // (deadline, order, key)
            let mut handles: Vec<(Handle, usize)> = Vec::new();
            let mut order = 0u64;
            for (i, (op, t, pick)) in ops.into_iter().enumerate() {
                match op {
                    0 => {
                        order += 1;
                        let hd = h.add(t, i);
                        handles.push((hd, i));
                        model.push((t, order, i));
                    }
                    1 if !handles.is_empty() => {
                        let (hd, key) = handles[pick % handles.len()];
                        let in_model = model.iter().position(|m| m.2 == key);
                        let got = h.cancel(hd);
                        prop_assert_eq!(got, in_model.map(|p| model.remove(p).2));
                    }
                    _ => {
                        model.sort_unstable();
                        let due: Vec<usize> = model.iter().filter(|m| m.0 <= t).map(|m| m.2).collect();
                        model.retain(|m| m.0 > t);
                        prop_assert_eq!(h.pop_expired(t), due);
                    }
                }
                prop_assert_eq!(h.len(), model.len());
                prop_assert_eq!(h.next_deadline(), model.iter().map(|m| m.0).min());
            }
        }
    }
}

#[cfg(feature = "python")]
pub mod python {
    use super::*;
    use pyo3::gc::PyVisit;
    use pyo3::prelude::*;
    use pyo3::types::PyList;
    use pyo3::PyTraverseError;

    /// Min-heap of deadlines keyed by Python objects (see `rustext._native.pyi`).
    #[pyclass(module = "rustext", name = "DeadlineHeap")]
    pub struct PyDeadlineHeap {
        inner: DeadlineHeap<Py<PyAny>>,
    }

    #[pymethods]
    impl PyDeadlineHeap {
        #[new]
        fn new() -> Self {
            PyDeadlineHeap { inner: DeadlineHeap::new() }
        }

        fn add(&mut self, deadline: i64, key: Py<PyAny>) -> Handle {
            self.inner.add(deadline, key)
        }

        fn cancel(&mut self, handle: Handle) -> bool {
            self.inner.cancel(handle).is_some()
        }

        fn __contains__(&self, handle: Handle) -> bool {
            self.inner.contains(handle)
        }

        fn pop_expired<'py>(&mut self, py: Python<'py>, now: i64) -> PyResult<Bound<'py, PyList>> {
            PyList::new(py, self.inner.pop_expired(now))
        }

        fn next_deadline(&self) -> Option<i64> {
            self.inner.next_deadline()
        }

        fn clear<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
            PyList::new(py, self.inner.clear())
        }

        fn __len__(&self) -> usize {
            self.inner.len()
        }

        // Keys may refer back to the heap's owner (a connection holding its
        // scheduler): let the GC see them so such cycles can be collected.
        fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
            for k in self.inner.keys() {
                visit.call(k)?;
            }
            Ok(())
        }

        fn __clear__(&mut self) {
            drop(self.inner.clear());
        }

        fn __bool__(&self) -> bool {
            !self.inner.is_empty()
        }
    }

    pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add_class::<PyDeadlineHeap>()?;
        Ok(())
    }
}
