// Interop peer for tests/rpc/test_quic_interop.py: a Go rpcx server or client over rpcx's
// "quic" network (built with -tags quic).
//
//	go run -tags quic . server NETWORK ADDR        serve Arith.Mul / Arith.Add on NETWORK@ADDR
//	                                                until killed; prints "ready"
//	go run -tags quic . client NETWORK ADDR A B [N] call Arith.Mul(A, B) N times (default 1) over
//	                                                one connection, print the last reply as JSON
//
// QUIC: the server needs TLS_CERT and TLS_KEY (PEM); with TLS_CA the client verifies the server
// against that CA (and TLS_SERVER_NAME, default the host of ADDR), without it the client does as
// rpcx does when given no TLS configuration: it skips verification.
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
	"time"

	"github.com/smallnest/rpcx/client"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
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
	return &tls.Config{RootCAs: roots, ServerName: name}
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: server NETWORK ADDR | client NETWORK ADDR A B [N]")
		os.Exit(2)
	}
	network, addr := os.Args[2], os.Args[3]
	switch os.Args[1] {
	case "server":
		opts := []server.OptionFn{}
		if conf := serverTLS(); conf != nil {
			opts = append(opts, server.WithTLSConfig(conf))
		}
		s := server.NewServer(opts...)
		if err := s.RegisterName("Arith", new(Arith), ""); err != nil {
			panic(err)
		}
		go func() {
			for s.Address() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			fmt.Println("ready", s.Address().String())
		}()
		if err := s.Serve(network, addr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "client":
		a, _ := strconv.Atoi(os.Args[4])
		b, _ := strconv.Atoi(os.Args[5])
		n := 1
		if len(os.Args) > 6 {
			n, _ = strconv.Atoi(os.Args[6])
		}
		opt := client.DefaultOption
		opt.SerializeType = protocol.JSON
		opt.TLSConfig = clientTLS(addr)
		d, err := client.NewPeer2PeerDiscovery(network+"@"+addr, "")
		if err != nil {
			panic(err)
		}
		xc := client.NewXClient("Arith", client.Failfast, client.RandomSelect, d, opt)
		defer xc.Close()
		reply := &Reply{}
		for i := 0; i < n; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := xc.Call(ctx, "Mul", &Args{A: a, B: b + i - (n - 1)}, reply)
			cancel()
			if err != nil {
				fmt.Fprintln(os.Stderr, "call failed:", err)
				os.Exit(1)
			}
		}
		out, _ := json.Marshal(reply)
		fmt.Println(string(out))
	default:
		os.Exit(2)
	}
}
