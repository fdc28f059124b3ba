// Package seq is the Go client of the seq sequence service: strictly
// increasing 64-bit IDs from a cluster of members that agree by quorum, and
// the decoder of the time-ordered (snowflake) IDs its workers hand out.
//
// A Sequence keeps a buffer of IDs: it asks a member for a range of IDs at a
// time and fetches the next range in the background when half of the current
// one is used, so most calls to Next return without a network round trip.
// Ranges are used in the order they were obtained, so the IDs one Sequence
// hands out are strictly increasing in the order Next returns them, whichever
// goroutine calls it.
//
// Members are tried round robin. A member that fails (unreachable, an error,
// no answer within the attempt timeout) is skipped for a backoff that doubles
// per consecutive failure, so a dead member costs one failed attempt, not one
// per draw; a member that answers "no quorum" is skipped briefly. A fetch
// that cannot complete within the sequence's timeout fails with an error
// wrapping ErrUnavailable and the last reason.
//
//	client, err := seq.Dial([]string{"127.0.0.1:19001", "127.0.0.1:19002", "127.0.0.1:19003"})
//	if err != nil { ... }
//	defer client.Close()
//	orders := client.Sequence("orders", seq.WithBufSize(1000))
//	id, err := orders.Next(ctx) // ctx bounds this draw
//
// The service speaks the RRSeq gRPC protocol (package pb holds its generated
// stubs), so the IDs are the same ones the Python client and the HTTP API get.
package seq
