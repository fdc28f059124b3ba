// Interop peer for tests/rpc/test_streams_interop.py: rpcx v1.9.1's file transfer
// (_filetransfer: TransferFile/DownloadFile) and stream service (_streamservice: Stream),
// as a Go server or a Go client. Data is deterministic (see pattern) so that both
// sides can check it by its sha256 without keeping it in memory.
//
//	go run . server ADDR FT_ADDR STREAM_ADDR DIR
//	        serve rpcx on ADDR with file transfer on FT_ADDR (uploads stored in DIR under
//	        their file name, downloads read from DIR) and an echo stream service on
//	        STREAM_ADDR; prints "ready" once all three listen
//	go run . send ADDR FILE SIZE
//	        write SIZE bytes of the pattern to FILE, then XClient.SendFile it to ADDR;
//	        prints "sent SHA256"
//	go run . download ADDR NAME
//	        XClient.DownloadFile NAME from ADDR; prints "received SHA256 BYTES"
//	go run . stream ADDR SIZE
//	        XClient.Stream to ADDR with meta mode=echo; writes SIZE bytes of the pattern
//	        (then half-closes) while reading what comes back until EOF;
//	        prints "sent SHA256 received SHA256 BYTES"
//
// SERIALIZE=json makes the clients call with JSON instead of rpcx's default msgpack.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/smallnest/rpcx/client"
	rpcxlog "github.com/smallnest/rpcx/log"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"
	"github.com/smallnest/rpcx/share"
)

const chunkSize = 64 << 10

// base is the 64 KiB block of the pattern: sha256("juggler-stream" || uint32be(i)), i = 0..2047.
func base() []byte {
	b := make([]byte, 0, chunkSize)
	for i := 0; len(b) < chunkSize; i++ {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(i))
		sum := sha256.Sum256(append([]byte("juggler-stream"), n[:]...))
		b = append(b, sum[:]...)
	}
	return b
}

// pattern writes size bytes: chunk k is uint64be(k) followed by base[8:].
func pattern(w io.Writer, size int64) error {
	chunk := base()
	for k := int64(0); size > 0; k++ {
		binary.BigEndian.PutUint64(chunk[:8], uint64(k))
		n := int64(chunkSize)
		if size < n {
			n = size
		}
		if _, err := w.Write(chunk[:n]); err != nil {
			return err
		}
		size -= n
	}
	return nil
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func xclient(addr, service string) client.XClient {
	d, err := client.NewPeer2PeerDiscovery("tcp@"+addr, "")
	if err != nil {
		fail("discovery: %v", err)
	}
	opt := client.DefaultOption
	if os.Getenv("SERIALIZE") == "json" {
		opt.SerializeType = protocol.JSON
	}
	return client.NewXClient(service, client.Failfast, client.RandomSelect, d, opt)
}

func waitListening(addr string) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			fail("%s does not listen: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func serve(addr, ftAddr, streamAddr, dir string) {
	rpcxlog.SetDummyLogger() // rpcx logs to stdout, where "ready" goes
	s := server.NewServer()
	upload := func(conn net.Conn, args *share.FileTransferArgs) {
		defer conn.Close()
		f, err := os.Create(filepath.Join(dir, filepath.Base(args.FileName)))
		if err != nil {
			fmt.Fprintf(os.Stderr, "upload %s: %v\n", args.FileName, err)
			return
		}
		n, err := io.Copy(f, conn)
		f.Close()
		fmt.Fprintf(os.Stderr, "upload %s: %d of %d bytes, %v\n", args.FileName, n, args.FileSize, err)
	}
	download := func(conn net.Conn, args *share.DownloadFileArgs) {
		defer conn.Close()
		f, err := os.Open(filepath.Join(dir, filepath.Base(args.FileName)))
		if err != nil {
			fmt.Fprintf(os.Stderr, "download %s: %v\n", args.FileName, err)
			return
		}
		defer f.Close()
		io.Copy(conn, f)
	}
	ft := server.NewFileTransfer(ftAddr, upload, download, 1000)
	s.EnableFileTransfer(share.SendFileServiceName, ft)
	echo := func(conn net.Conn, args *share.StreamServiceArgs) {
		defer conn.Close()
		io.Copy(conn, conn)
	}
	s.EnableStreamService(share.StreamServiceName, server.NewStreamService(streamAddr, echo, nil, 1000))
	go func() {
		if err := s.Serve("tcp", addr); err != nil && err != server.ErrServerClosed {
			fail("serve: %v", err)
		}
	}()
	waitListening(addr)
	waitListening(ftAddr)
	waitListening(streamAddr)
	fmt.Println("ready")
	select {}
}

func sum(h io.Writer) string {
	return hex.EncodeToString(h.(interface{ Sum([]byte) []byte }).Sum(nil))
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: server ADDR FT_ADDR STREAM_ADDR DIR | send ADDR FILE SIZE | download ADDR NAME | stream ADDR SIZE")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	switch mode, addr := os.Args[1], os.Args[2]; mode {
	case "server":
		serve(addr, os.Args[3], os.Args[4], os.Args[5])
	case "send":
		size, _ := strconv.ParseInt(os.Args[4], 10, 64)
		f, err := os.Create(os.Args[3])
		if err != nil {
			fail("create: %v", err)
		}
		h := sha256.New()
		if err := pattern(io.MultiWriter(f, h), size); err != nil {
			fail("write: %v", err)
		}
		f.Close()
		xc := xclient(addr, share.SendFileServiceName)
		defer xc.Close()
		if err := xc.SendFile(ctx, os.Args[3], 0, map[string]string{"from": "go"}); err != nil {
			fail("send failed: %v", err)
		}
		fmt.Println("sent", sum(h))
	case "download":
		xc := xclient(addr, share.SendFileServiceName)
		defer xc.Close()
		h := sha256.New()
		cw := &counter{w: h}
		if err := xc.DownloadFile(ctx, os.Args[3], cw, map[string]string{"from": "go"}); err != nil {
			fail("download failed: %v", err)
		}
		fmt.Println("received", sum(h), cw.n)
	case "stream":
		size, _ := strconv.ParseInt(os.Args[3], 10, 64)
		xc := xclient(addr, share.StreamServiceName)
		defer xc.Close()
		conn, err := xc.Stream(ctx, map[string]string{"mode": "echo"})
		if err != nil {
			fail("stream failed: %v", err)
		}
		defer conn.Close()
		sent := sha256.New()
		errc := make(chan error, 1)
		go func() {
			err := pattern(io.MultiWriter(conn, sent), size)
			if err == nil {
				err = conn.(*net.TCPConn).CloseWrite()
			}
			errc <- err
		}()
		got := sha256.New()
		cw := &counter{w: got}
		if _, err := io.Copy(cw, conn); err != nil {
			fail("stream read: %v", err)
		}
		if err := <-errc; err != nil {
			fail("stream write: %v", err)
		}
		fmt.Println("sent", sum(sent), "received", sum(got), cw.n)
	default:
		fail("unknown mode %q", mode)
	}
}

type counter struct {
	w io.Writer
	n int64
}

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.w.Write(p)
}
