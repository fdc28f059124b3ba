// h3load: a closed-loop HTTP load generator speaking HTTP/2 or HTTP/3, so
// that both protocols are driven by the same client code in one run.
//
//	h3load -proto h3 -url https://localhost:8443/size/1024 -ca ca.pem -c 32 -d 3s
//
// It prints one JSON line: requests, failures (errors and non-2xx), seconds.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go/http3"
)

func main() {
	proto := flag.String("proto", "h2", "h2 or h3")
	url := flag.String("url", "", "the URL to GET")
	caFile := flag.String("ca", "", "the CA that signed the server's certificate (PEM)")
	conc := flag.Int("c", 32, "requests in flight at once (over one connection)")
	dur := flag.Duration("d", 3*time.Second, "how long to run")
	flag.Parse()
	pem, err := os.ReadFile(*caFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "h3load:", err)
		os.Exit(2)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tlsConf := &tls.Config{RootCAs: pool}
	var rt http.RoundTripper
	if *proto == "h3" {
		rt = &http3.Transport{TLSClientConfig: tlsConf}
	} else {
		t := &http.Transport{TLSClientConfig: tlsConf, ForceAttemptHTTP2: true, MaxConnsPerHost: 1}
		rt = t
	}
	client := &http.Client{Transport: rt, Timeout: 10 * time.Second}
	// one request first: the connection is up before the clock starts
	if resp, err := client.Get(*url); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != map[string]int{"h2": 2, "h3": 3}[*proto] {
			fmt.Fprintln(os.Stderr, "h3load: the server answered over", resp.Proto)
			os.Exit(1)
		}
	} else {
		fmt.Fprintln(os.Stderr, "h3load:", err)
		os.Exit(1)
	}
	var done, failed atomic.Int64
	stop := time.Now().Add(*dur)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < *conc; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				resp, err := client.Get(*url)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode/100 != 2 {
					failed.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	out, _ := json.Marshal(map[string]any{"requests": done.Load(), "failures": failed.Load(),
		"seconds": time.Since(start).Seconds()})
	fmt.Println(string(out))
}
