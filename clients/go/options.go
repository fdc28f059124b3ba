package seq

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ClientOption configures Dial.
type ClientOption func(*clientConfig)

type clientConfig struct {
	creds       credentials.TransportCredentials
	dialOptions []grpc.DialOption
	backoffMin  time.Duration
	backoffMax  time.Duration
}

// WithTLS makes the client speak TLS to the members (the members run with --tls-cert).
func WithTLS(creds credentials.TransportCredentials) ClientOption {
	return func(c *clientConfig) { c.creds = creds }
}

// WithDialOptions adds gRPC dial options (interceptors, keepalive, ...).
func WithDialOptions(opts ...grpc.DialOption) ClientOption {
	return func(c *clientConfig) { c.dialOptions = append(c.dialOptions, opts...) }
}

// WithBackoff sets how long a failed member is skipped: min after its first
// failure, doubling per consecutive failure up to max, with jitter
// (default 100 ms to 5 s).
func WithBackoff(min, max time.Duration) ClientOption {
	return func(c *clientConfig) { c.backoffMin, c.backoffMax = min, max }
}

// SequenceOption configures Client.Sequence.
type SequenceOption func(*seqConfig)

type seqConfig struct {
	bufSize        uint64
	maxFetch       uint64
	timeout        time.Duration
	attemptTimeout time.Duration
}

// WithBufSize: how many IDs a fetch asks for at least (default 100). 0 fetches
// nothing ahead: each fetch asks for as many IDs as callers are waiting, so no
// ID is taken that no one asked for.
func WithBufSize(n uint64) SequenceOption {
	return func(c *seqConfig) { c.bufSize = n }
}

// WithMaxFetch caps the adaptive fetch size (default 64 × the buffer size).
// Consumers that drain a range faster than a fetch takes get larger ranges,
// up to this; WithMaxFetch(bufSize) turns the adaptation off.
func WithMaxFetch(n uint64) SequenceOption {
	return func(c *seqConfig) { c.maxFetch = n }
}

// WithTimeout bounds one fetch, every retry and fail-over included (default 5 s).
func WithTimeout(d time.Duration) SequenceOption {
	return func(c *seqConfig) { c.timeout = d }
}

// WithAttemptTimeout bounds one member's answer (default a third of the
// timeout), so that one hung member cannot use a whole fetch's time.
func WithAttemptTimeout(d time.Duration) SequenceOption {
	return func(c *seqConfig) { c.attemptTimeout = d }
}
