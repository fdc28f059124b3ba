// Interop peer for tests/rpc/test_rpcx_interop.py: a Go rpcx server or client.
//
//	go run . server ADDR         serve Arith.Mul / Arith.Add (JSON) on ADDR until killed; prints "ready"
//	go run . client ADDR A B     call Arith.Mul(A, B) over rpcx and print the reply as JSON
//	go run . httpclient ADDR A B the same through rpcx's "http" network (http@ADDR: an HTTP
//	                             CONNECT /_rpcx_, then rpcx on that connection)
//	go run . push ADDR N         with heartbeats every 50 ms, call Probe.Push({"n": N}) on a
//	                             bidirectional client; print the reply, then each pushed message
//	go run . bench ADDR C N      C goroutines share one client and make N Arith.Mul calls in all;
//	                             print "calls N seconds S" (the load of benches/rpc/bench_goclient.py)
//
// TLS: with TLS_CERT and TLS_KEY (PEM files) the server serves rpcx over TLS; with TLS_CA
// the clients connect over TLS and verify the server against that CA (and TLS_SERVER_NAME,
// default the host of ADDR); TLS_CLIENT_CERT/TLS_CLIENT_KEY give clients a certificate.
// AUTH: the client sets it with XClient.Auth (rpcx's __AUTH metadata).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
	"github.com/smallnest/rpcx/share"
)

type Args struct {
	A int `json:"A"`
	B int `json:"B"`
}

type Reply struct {
	C int `json:"C"`
}

type Arith struct{}

func (t *Arith) Mul(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A * args.B
	return nil
}

func (t *Arith) Add(ctx context.Context, args *Args, reply *Reply) error {
	reply.C = args.A + args.B
	return nil
}

// serverTLS is the server's TLS configuration from TLS_CERT/TLS_KEY, or nil.
func serverTLS() *tls.Config {
	cert, key := os.Getenv("TLS_CERT"), os.Getenv("TLS_KEY")
	if cert == "" {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		panic(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}}
}

// clientTLS is the clients' TLS configuration from TLS_CA (and a client certificate), or nil.
func clientTLS(addr string) *tls.Config {
	ca := os.Getenv("TLS_CA")
	if ca == "" {
		return nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		panic("no certificate in " + ca)
	}
	name := os.Getenv("TLS_SERVER_NAME")
	if name == "" {
		name, _, _ = net.SplitHostPort(addr)
	}
	conf := &tls.Config{RootCAs: roots, ServerName: name}
	if cert := os.Getenv("TLS_CLIENT_CERT"); cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, os.Getenv("TLS_CLIENT_KEY"))
		if err != nil {
			panic(err)
		}
		conf.Certificates = []tls.Certificate{pair}
	}
	return conf
}

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: server ADDR | client ADDR A B")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "server":
		var s *server.Server
		if conf := serverTLS(); conf != nil {
			s = server.NewServer(server.WithTLSConfig(conf))
		} else {
			s = server.NewServer()
		}
		if err := s.RegisterName("Arith", new(Arith), ""); err != nil {
			panic(err)
		}
		go func() {
			for s.Address() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Println("ready", s.Address().String())
		}()
		if err := s.Serve("tcp", os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "client", "httpclient":
		a, _ := strconv.Atoi(os.Args[3])
		b, _ := strconv.Atoi(os.Args[4])
		opt := client.DefaultOption
		opt.SerializeType = protocol.JSON
		opt.TLSConfig = clientTLS(os.Args[2])
		network := "tcp"
		if os.Args[1] == "httpclient" {
			network = "http"
		}
		d, err := client.NewPeer2PeerDiscovery(network+"@"+os.Args[2], "")
		if err != nil {
			panic(err)
		}
		xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
		defer xc.Close()
		if token := os.Getenv("AUTH"); token != "" {
			xc.Auth(token)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx = context.WithValue(ctx, share.ReqMetaDataKey, map[string]string{"k": "v"})
		reply := &Reply{}
		if err := xc.Call(ctx, "Mul", &Args{A: a, B: b}, reply); err != nil {
			fmt.Fprintln(os.Stderr, "call failed:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(reply)
		fmt.Println(string(out))
	case "push":
		n, _ := strconv.Atoi(os.Args[3])
		opt := client.DefaultOption
		opt.SerializeType = protocol.JSON
		opt.Heartbeat = true
		opt.HeartbeatInterval = 50 * time.Millisecond
		opt.TLSConfig = clientTLS(os.Args[2])
		d, err := client.NewPeer2PeerDiscovery("tcp@"+os.Args[2], "")
		if err != nil {
			panic(err)
		}
		ch := make(chan *protocol.Message, n+1)
		xc := client.NewBidirectionalXClient("Probe", client.Failfast, client.RandomSelect, d, opt, ch)
		defer xc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		reply := map[string]int{}
		if err := xc.Call(ctx, "Push", map[string]int{"n": n}, &reply); err != nil {
			fmt.Fprintln(os.Stderr, "call failed:", err)
			os.Exit(1)
		}
		out, _ := json.Marshal(reply)
		fmt.Println(string(out))
		for i := 0; i < n; i++ {
			select {
			case m := <-ch:
				fmt.Println(m.ServicePath, m.ServiceMethod, string(m.Payload))
			case <-time.After(5 * time.Second):
				fmt.Fprintln(os.Stderr, "no push")
				os.Exit(1)
			}
		}
		time.Sleep(200 * time.Millisecond) // a few heartbeats, then one more call on the same connection
		if err := xc.Call(ctx, "Push", map[string]int{"n": 0}, &reply); err != nil {
			fmt.Fprintln(os.Stderr, "call after heartbeats failed:", err)
			os.Exit(1)
		}
		fmt.Println("ok")
	case "bench":
		bench(os.Args[2], os.Args[3], os.Args[4])
	default:
		os.Exit(2)
	}
}

// bench is rpcx's own client under load: C goroutines calling Arith.Mul on one
// XClient (one connection, calls multiplexed as rpcx-benchmark's client does).
func bench(addr, cs, ns string) {
	c, _ := strconv.Atoi(cs)
	n, _ := strconv.Atoi(ns)
	opt := client.DefaultOption
	opt.SerializeType = protocol.JSON
	d, err := client.NewPeer2PeerDiscovery("tcp@"+addr, "")
	if err != nil {
		panic(err)
	}
	xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
	defer xc.Close()
	reply := &Reply{}
	if err := xc.Call(context.Background(), "Mul", &Args{A: 6, B: 7}, reply); err != nil || reply.C != 42 {
		fmt.Fprintln(os.Stderr, "warm-up call failed:", err, reply.C)
		os.Exit(1)
	}
	var left atomic.Int64
	left.Store(int64(n))
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < c; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &Reply{}
			for left.Add(-1) >= 0 {
				if err := xc.Call(context.Background(), "Mul", &Args{A: 6, B: 7}, r); err != nil || r.C != 42 {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	if failed.Load() > 0 {
		fmt.Fprintln(os.Stderr, "failed calls:", failed.Load())
		os.Exit(1)
	}
	fmt.Printf("calls %d seconds %.6f\n", n, elapsed)
}
