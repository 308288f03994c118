// The floor any admission webhook pays: TLS, one JSON decode of the AdmissionReview, one JSON
// encode of an answer that allows the pod unchanged. Go's net/http, standard library only; it
// offers HTTP/2 over TLS (ALPN h2) as net/http does by default, so the API server's client may
// multiplex its calls on one connection. benchmarks/create_latency.py compares gpugate with it.
//
// With --patch, /mutate answers that JSON Patch (the bytes of the file, unchanged) instead of an
// allow-only answer: the floor a *mutating* webhook pays, whose API server must apply the patch and
// carry the bigger pod through validation, the validating call and etcd, which an allow-only floor hides. /validate
// always allows.
//
//	floor-webhook --bind 127.0.0.1:PORT --cert tls.crt --key tls.key [--patch patch.json]
package main

import (
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// What the client did, for /stats: connections opened, and requests by protocol (HTTP/1.1, HTTP/2.0).
var (
	connections atomic.Int64
	protocols   sync.Map
)

type review struct {
	APIVersion string    `json:"apiVersion"`
	Kind       string    `json:"kind"`
	Response   *response `json:"response"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     []byte `json:"patch,omitempty"` // base64 in JSON, as admission/v1 wants
}

// The JSON Patch /mutate answers (nil: allow unchanged); read once at start.
var mutatePatch []byte

func admit(w http.ResponseWriter, r *http.Request) {
	counter, _ := protocols.LoadOrStore(r.Proto, new(atomic.Int64))
	counter.(*atomic.Int64).Add(1)
	var in struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Request    struct {
			UID    string          `json:"uid"`
			Object json.RawMessage `json:"object"`
		} `json:"request"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var pod map[string]any // decoded as a policy engine would, not skipped as raw bytes
	if err := json.Unmarshal(in.Request.Object, &pod); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	out := review{APIVersion: in.APIVersion, Kind: in.Kind, Response: &response{UID: in.Request.UID, Allowed: true}}
	if mutatePatch != nil && r.URL.Path == "/mutate" {
		out.Response.PatchType, out.Response.Patch = "JSONPatch", mutatePatch
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		log.Printf("answer: %v", err)
	}
}

func main() {
	bind := flag.String("bind", "127.0.0.1:8443", "address to listen on")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM)")
	patchFile := flag.String("patch", "", "a JSON Patch file /mutate answers with (default: allow unchanged)")
	flag.Parse()
	if *patchFile != "" {
		data, err := os.ReadFile(*patchFile)
		if err != nil {
			log.Fatalf("patch: %v", err)
		}
		var ops []map[string]any
		if err := json.Unmarshal(data, &ops); err != nil {
			log.Fatalf("patch %s is not a JSON Patch: %v", *patchFile, err)
		}
		mutatePatch = data
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/mutate", admit)
	mux.HandleFunc("/validate", admit)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		stats := map[string]int64{"connections": connections.Load()}
		protocols.Range(func(key, value any) bool {
			stats[key.(string)] = value.(*atomic.Int64).Load()
			return true
		})
		_ = json.NewEncoder(w).Encode(stats)
	})
	server := &http.Server{Addr: *bind, Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 90 * time.Second,
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				connections.Add(1)
			}
		}}
	log.Printf("serving https://%s", *bind)
	log.Fatal(server.ListenAndServeTLS(*cert, *key))
}
