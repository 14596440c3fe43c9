// Command revproxy is a bare httputil.ReverseProxy on 127.0.0.1, the
// baseline of what one proxy process in the path costs (BenchmarkToolsCall
// processes/reverse_proxy): revproxy LISTEN_ADDR UPSTREAM_URL.
package main

import (
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	if len(os.Args) != 3 {
		log.Fatal("usage: revproxy LISTEN_ADDR UPSTREAM_URL")
	}
	u, err := url.Parse(os.Args[2])
	if err != nil {
		log.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.URL.Path = u.Path },
		FlushInterval: -1, // SSE: pass each event on at once
	}
	log.Fatal(http.ListenAndServe(os.Args[1], rp))
}
