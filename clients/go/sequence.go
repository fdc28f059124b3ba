package seq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Sequence hands out the IDs of one named sequence from a buffer (see the
// package documentation). Safe for concurrent use.
//
// What a Sequence holds unused at any time is at most two ranges of at most
// the max fetch size each: those IDs are lost as a gap if the process exits.
type Sequence struct {
	name   string
	client *Client
	cfg    seqConfig

	mu        sync.Mutex
	cur, end  uint64 // the current range [cur, end)
	start     uint64 // where the current range began (for the adaptive size)
	refillAt  uint64 // handing out this ID starts a background fetch (0: none)
	queued    *[2]uint64
	high      uint64 // one past the highest ID ever obtained
	fetchSize uint64 // what the next background fetch asks for (adaptive)
	fetch     *fetchCall
	waiting   int
	closed    bool
	ctx       context.Context // cancelled by Close: stops the fetch in flight
	cancel    context.CancelFunc
}

type fetchCall struct {
	done       chan struct{}
	err        error
	background bool // started ahead of need
}

// Sequence returns the sequence name, buffered on the client's connections.
// Sequences of the same name on one client are independent buffers.
func (c *Client) Sequence(name string, opts ...SequenceOption) *Sequence {
	cfg := seqConfig{bufSize: 100, timeout: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.maxFetch < cfg.bufSize {
		cfg.maxFetch = 64 * cfg.bufSize
	}
	if cfg.timeout <= 0 {
		cfg.timeout = 5 * time.Second
	}
	if cfg.attemptTimeout <= 0 {
		cfg.attemptTimeout = cfg.timeout / 3
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sequence{name: name, client: c, cfg: cfg, fetchSize: cfg.bufSize, ctx: ctx, cancel: cancel}
	c.mu.Lock()
	if c.closed {
		s.closed = true
	} else {
		c.seqs[s] = struct{}{}
	}
	c.mu.Unlock()
	return s
}

// Name of the sequence.
func (s *Sequence) Name() string { return s.name }

// Next returns the next ID. ctx bounds this draw: when it ends first, Next
// returns ctx's error and the fetch it waited for goes on for the others.
// Errors wrap ErrUnavailable (no range within the timeout), ErrExhausted,
// ErrClosed or ErrInconsistent.
func (s *Sequence) Next(ctx context.Context) (uint64, error) {
	s.mu.Lock()
	for {
		if s.closed {
			s.mu.Unlock()
			return 0, ErrClosed
		}
		if s.cur < s.end {
			id := s.cur
			if id == s.refillAt {
				s.refillAt = 0
				s.prefetch()
			}
			s.cur++
			s.mu.Unlock()
			return id, nil
		}
		if s.queued != nil {
			s.setCurrent(s.queued[0], s.queued[1])
			s.queued = nil
			continue
		}
		if s.fetch == nil {
			n := s.fetchSize
			if w := uint64(s.waiting + 1); w > n {
				n = w
			}
			s.startFetch(n, false)
		} else if s.fetch.background && s.cfg.bufSize > 0 {
			// Ran dry while the prefetch was still in flight: ask for (much) more next time.
			s.fetch.background = false
			s.fetchSize = min(s.cfg.maxFetch, s.fetchSize*4)
		}
		call := s.fetch
		s.waiting++
		s.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
			return 0, ctx.Err()
		}
		s.mu.Lock()
		s.waiting--
		if call.err != nil && s.cur >= s.end && s.queued == nil {
			s.mu.Unlock()
			return 0, call.err
		}
	}
}

// Close stops fetching; callers waiting in Next get ErrClosed. Idempotent.
func (s *Sequence) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.cur, s.end, s.queued = 0, 0, nil
	call := s.fetch
	s.mu.Unlock()
	s.cancel()
	if call != nil {
		<-call.done
	}
	s.client.mu.Lock()
	delete(s.client.seqs, s)
	s.client.mu.Unlock()
}

// setCurrent makes [lo, hi) the current range; the background fetch starts
// when half of it is used. Called with mu held.
func (s *Sequence) setCurrent(lo, hi uint64) {
	s.cur, s.end, s.start = lo, hi, lo
	s.refillAt = 0
	if s.cfg.bufSize > 0 {
		s.refillAt = max(lo, hi-1-(hi-lo)/2)
	}
}

// prefetch starts the background fetch unless one is in flight or a range is
// queued. Called with mu held.
func (s *Sequence) prefetch() {
	if s.fetch == nil && s.queued == nil && !s.closed {
		s.startFetch(s.fetchSize, true)
	}
}

func (s *Sequence) startFetch(n uint64, background bool) {
	call := &fetchCall{done: make(chan struct{}), background: background}
	s.fetch = call
	go s.runFetch(call, n)
}

func (s *Sequence) runFetch(call *fetchCall, n uint64) {
	from, to, err := s.client.fetch(s.ctx, s.name, n, s.cfg.timeout, s.cfg.attemptTimeout)
	s.mu.Lock()
	if err == nil && !s.closed {
		err = s.install(from, to)
	}
	if s.closed && err == nil {
		err = ErrClosed
	}
	call.err = err
	s.fetch = nil
	s.mu.Unlock()
	close(call.done)
}

// install takes a fetched range: current if the buffer is empty, else queued
// (adapting the next fetch's size to how fast the consumers drain). Called
// with mu held.
func (s *Sequence) install(lo, hi uint64) error {
	if lo < s.high || hi <= lo {
		return fmt.Errorf("%w: range [%d, %d) is below ID %d", ErrInconsistent, lo, hi, s.high-1)
	}
	s.high = hi
	if s.cur < s.end {
		left, size := s.end-s.cur, s.end-s.start
		if left*4 > size {
			// Arrived with more than a quarter unused: consumers are slower than a round trip.
			s.fetchSize = max(s.cfg.bufSize, s.fetchSize/2)
		} else if left*16 < size && s.cfg.bufSize > 0 {
			// Arrived just in time: grow before the consumers run dry.
			s.fetchSize = min(s.cfg.maxFetch, s.fetchSize*2)
		}
		s.queued = &[2]uint64{lo, hi}
		return nil
	}
	s.setCurrent(lo, hi)
	return nil
}

// IsUnavailable reports whether err means no member could give a range in time.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
