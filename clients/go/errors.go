package seq

import "errors"

var (
	// ErrUnavailable: no member gave a range within the sequence's timeout
	// (every member down, partitioned from a quorum, or removed).
	ErrUnavailable = errors.New("seq: unavailable")
	// ErrExhausted: the sequence reached the largest ID and hands out no more.
	ErrExhausted = errors.New("seq: sequence exhausted")
	// ErrClosed: the Sequence or its Client was closed.
	ErrClosed = errors.New("seq: closed")
	// ErrInconsistent: a member answered a range below an ID already handed
	// out. It means a cluster that lost acknowledged state; the range is refused.
	ErrInconsistent = errors.New("seq: range below an ID already obtained")
)
