package seq

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The cluster tests need a running three-member cluster: SEQ_SERVERS lists
// its members (HOST:PORT,...) and SEQ_KILL_PID names the process of one of
// them, which TestMemberKilledWhileDrawing kills. The test command starts
// one (tests/seq/test_clients.py); by hand:
//
//	juggler seq up &   # members on 127.0.0.1:19001-19003
//	SEQ_SERVERS=127.0.0.1:19001,127.0.0.1:19002,127.0.0.1:19003 go test ./...
func clusterServers(t *testing.T) []string {
	t.Helper()
	v := os.Getenv("SEQ_SERVERS")
	if v == "" {
		t.Skip("SEQ_SERVERS is not set (the members of a running seq cluster)")
	}
	return strings.Split(v, ",")
}

func dial(t *testing.T, servers []string, opts ...ClientOption) *Client {
	t.Helper()
	c, err := Dial(servers, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func within(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// draw takes n IDs from s with k goroutines; the IDs each goroutine gets
// must increase (a Sequence hands IDs out in order).
func draw(t *testing.T, ctx context.Context, s *Sequence, k, n int, during func(i int)) []uint64 {
	t.Helper()
	var mu sync.Mutex
	var all []uint64
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for g := 0; g < k; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var last uint64
			for i := 0; i < n; i++ {
				if g == 0 && during != nil {
					during(i)
				}
				id, err := s.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				if id <= last {
					errs <- errors.New("IDs out of order: " + strconv.FormatUint(id, 10) + " after " + strconv.FormatUint(last, 10))
					return
				}
				last = id
				mu.Lock()
				all = append(all, id)
				mu.Unlock()
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return all
}

func assertUnique(t *testing.T, ids []uint64) {
	t.Helper()
	seen := make(map[uint64]struct{}, len(ids))
	for _, id := range ids {
		if _, dup := seen[id]; dup {
			t.Fatalf("ID %d handed out twice", id)
		}
		seen[id] = struct{}{}
	}
}

func TestDrawsAreUniqueAndIncreasing(t *testing.T) {
	c := dial(t, clusterServers(t))
	ctx := within(t, 30*time.Second)
	s := c.Sequence("go-draws", WithBufSize(50))
	ids := draw(t, ctx, s, 8, 500, nil)
	assertUnique(t, ids)
	// a second client of the same sequence never gets the first one's IDs
	other := dial(t, clusterServers(t)).Sequence("go-draws", WithBufSize(0))
	more := draw(t, ctx, other, 2, 20, nil)
	assertUnique(t, append(ids, more...))
	cur, err := c.CurID(ctx, "go-draws")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range more {
		if id > cur {
			t.Fatalf("CurID %d is below the handed-out ID %d", cur, id)
		}
	}
}

func TestUnbufferedTakesOnlyWhatIsAskedFor(t *testing.T) {
	servers := clusterServers(t)
	ctx := within(t, 20*time.Second)
	s := dial(t, servers).Sequence("go-unbuffered", WithBufSize(0))
	a, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b != a+1 {
		t.Fatalf("with no buffer, two draws of one client should be consecutive: %d then %d", a, b)
	}
}

func TestFailsOverPastADeadMember(t *testing.T) {
	servers := clusterServers(t)
	dead := closedPort(t)
	c := dial(t, append([]string{dead}, servers...))
	ctx := within(t, 30*time.Second)
	s := c.Sequence("go-failover", WithBufSize(0), WithTimeout(10*time.Second))
	assertUnique(t, draw(t, ctx, s, 4, 50, nil))
}

// A member killed (kill -9) while goroutines draw: every draw succeeds on the
// two others and no ID is handed out twice.
func TestMemberKilledWhileDrawing(t *testing.T) {
	servers := clusterServers(t)
	pid, err := strconv.Atoi(os.Getenv("SEQ_KILL_PID"))
	if err != nil {
		t.Skip("SEQ_KILL_PID is not set (the process of a cluster member this test may kill)")
	}
	c := dial(t, servers)
	ctx := within(t, 60*time.Second)
	s := c.Sequence("go-kill", WithBufSize(20), WithTimeout(15*time.Second))
	var once sync.Once
	ids := draw(t, ctx, s, 6, 400, func(i int) {
		if i == 100 {
			once.Do(func() {
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Errorf("kill %d: %v", pid, err)
				}
			})
		}
	})
	assertUnique(t, ids)
	// a fresh client, after the kill, still never repeats an ID
	after := draw(t, ctx, dial(t, servers).Sequence("go-kill", WithBufSize(0)), 2, 50, nil)
	assertUnique(t, append(ids, after...))
}

func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentServer accepts connections and never answers (a hung member).
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

func TestUnavailableWithinTheTimeout(t *testing.T) {
	c := dial(t, []string{closedPort(t), closedPort(t)}, WithBackoff(20*time.Millisecond, 100*time.Millisecond))
	s := c.Sequence("nowhere", WithTimeout(700*time.Millisecond))
	start := time.Now()
	_, err := s.Next(within(t, 10*time.Second))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("want ErrUnavailable, got %v", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("the fetch's timeout is 700ms, Next took %s", waited)
	}
	if !strings.Contains(err.Error(), "nowhere") {
		t.Errorf("the error should name the sequence: %v", err)
	}
}

func TestTheCallersDeadlineBoundsADraw(t *testing.T) {
	c := dial(t, []string{silentServer(t)})
	s := c.Sequence("hung", WithTimeout(30*time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Next(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the caller's deadline, got %v", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("the caller gave 300ms, Next took %s", waited)
	}
}

func TestCloseReleasesWaitingCallers(t *testing.T) {
	c := dial(t, []string{silentServer(t)})
	s := c.Sequence("hung", WithTimeout(30*time.Second))
	got := make(chan error, 1)
	go func() {
		_, err := s.Next(within(t, 20*time.Second))
		got <- err
	}()
	// wait until the caller waits on the fetch
	for deadline := time.Now().Add(5 * time.Second); ; {
		s.mu.Lock()
		waiting := s.waiting
		s.mu.Unlock()
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the caller never started waiting")
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Close()
	select {
	case err := <-got:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("want ErrClosed, got %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release the waiting caller")
	}
	if _, err := s.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("a closed sequence answered %v", err)
	}
}
