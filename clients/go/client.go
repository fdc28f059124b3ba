package seq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"juggler-suite/seq/pb"
)

// Client holds one gRPC connection per member, shared by every Sequence made
// from it. Safe for concurrent use.
type Client struct {
	cfg     clientConfig
	conns   []*grpc.ClientConn
	members []*member

	mu     sync.Mutex // guards rr and the members' failure state
	rr     int
	closed bool
	seqs   map[*Sequence]struct{}
}

type member struct {
	addr     string
	stub     pb.RRAPIClient
	failures int
	retryAt  time.Time
	removed  bool // answered FAILED_PRECONDITION: no longer a member of the cluster
}

// Dial makes a client of the members at servers (HOST:PORT). Connections are
// made lazily by gRPC, so Dial does not fail when a member is down.
func Dial(servers []string, opts ...ClientOption) (*Client, error) {
	if len(servers) == 0 {
		return nil, errors.New("seq: at least one server")
	}
	cfg := clientConfig{backoffMin: 100 * time.Millisecond, backoffMax: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.backoffMin <= 0 || cfg.backoffMax < cfg.backoffMin {
		return nil, errors.New("seq: backoff needs 0 < min <= max")
	}
	creds := cfg.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	dial := append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, cfg.dialOptions...)
	c := &Client{cfg: cfg, seqs: map[*Sequence]struct{}{}}
	for _, addr := range servers {
		conn, err := grpc.NewClient(addr, dial...)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("seq: server %q: %w", addr, err)
		}
		c.conns = append(c.conns, conn)
		c.members = append(c.members, &member{addr: addr, stub: pb.NewRRAPIClient(conn)})
	}
	return c, nil
}

// Close closes every Sequence made from the client (their waiting callers
// get ErrClosed) and the connections.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	seqs := make([]*Sequence, 0, len(c.seqs))
	for s := range c.seqs {
		seqs = append(seqs, s)
	}
	c.mu.Unlock()
	for _, s := range seqs {
		s.Close()
	}
	var first error
	for _, conn := range c.conns {
		if err := conn.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// CurID is the highest ID handed out of sequence name, as one member knows it
// (a read of a single member: other members may know a higher one).
func (c *Client) CurID(ctx context.Context, name string) (uint64, error) {
	var last error
	for _, m := range c.members {
		reply, err := m.stub.GRPCCurID(ctx, &pb.CurIDRequest{Name: name})
		if err == nil {
			return reply.GetCurId(), nil
		}
		last = fmt.Errorf("%s: %w", m.addr, err)
		if ctx.Err() != nil {
			break
		}
	}
	return 0, fmt.Errorf("%w: %v", ErrUnavailable, last)
}

// fetch obtains a fresh range [from, to) of n IDs of name, trying members
// round robin until timeout.
func (c *Client) fetch(ctx context.Context, name string, n uint64, timeout, attempt time.Duration) (uint64, uint64, error) {
	deadline := time.Now().Add(timeout)
	reason := "no server tried"
	for {
		now := time.Now()
		if !now.Before(deadline) {
			return 0, 0, fmt.Errorf("%w: no range of %q within %s: %s", ErrUnavailable, name, timeout, reason)
		}
		m, wake, allRemoved := c.pick(now)
		if allRemoved {
			return 0, 0, fmt.Errorf("%w: no range of %q: every server given was removed from the cluster (%s); give the current members",
				ErrUnavailable, name, reason)
		}
		if m == nil {
			if wake.After(deadline) {
				wake = deadline
			}
			t := time.NewTimer(wake.Sub(now))
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return 0, 0, ErrClosed
			}
			continue
		}
		budget := deadline.Sub(now)
		if attempt < budget {
			budget = attempt
		}
		actx, cancel := context.WithTimeout(ctx, budget)
		reply, err := m.stub.GRPCNextID(actx, &pb.NextIDRequest{Name: name, RangeSize: int64(n)})
		cancel()
		if ctx.Err() != nil {
			return 0, 0, ErrClosed
		}
		if err != nil {
			st := status.Convert(err)
			switch st.Code() {
			case codes.OutOfRange:
				return 0, 0, fmt.Errorf("%w: %s", ErrExhausted, st.Message())
			case codes.FailedPrecondition:
				reason = fmt.Sprintf("%s: %s %s", m.addr, st.Code(), st.Message())
				c.mu.Lock()
				m.removed = true
				c.mu.Unlock()
				continue
			}
			reason = fmt.Sprintf("%s: %s %s", m.addr, st.Code(), st.Message())
			c.failed(m, false)
			continue
		}
		from, to := reply.GetFromId(), reply.GetToId()
		if from == 0 || to <= from {
			reason = m.addr + ": no quorum"
			c.failed(m, true)
			continue
		}
		c.mu.Lock()
		m.failures = 0
		c.mu.Unlock()
		return from, to, nil
	}
}

// pick: the next member that may be tried now, else when the first may be.
func (c *Client) pick(now time.Time) (m *member, wake time.Time, allRemoved bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := len(c.members)
	allRemoved = true
	for i := 0; i < k; i++ {
		cand := c.members[(c.rr+i)%k]
		if cand.removed {
			continue
		}
		allRemoved = false
		if !cand.retryAt.After(now) {
			c.rr = (c.rr + i + 1) % k
			return cand, time.Time{}, false
		}
		if wake.IsZero() || cand.retryAt.Before(wake) {
			wake = cand.retryAt
		}
	}
	return nil, wake, allRemoved
}

// failed skips m for a backoff: doubling per consecutive failure, with
// jitter; soft (a "no quorum" answer) skips it for the shortest one.
func (c *Client) failed(m *member, soft bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m.failures++
	n := m.failures
	if soft {
		n = 1
	}
	d := c.cfg.backoffMin
	for i := 1; i < n && d < c.cfg.backoffMax; i++ {
		d *= 2
	}
	if d > c.cfg.backoffMax {
		d = c.cfg.backoffMax
	}
	d -= time.Duration(rand.Float64() * 0.5 * float64(d)) // jitter: members failed together retry apart
	m.retryAt = time.Now().Add(d)
}
