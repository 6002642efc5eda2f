package httpserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/httpserver"
)

// selfSigned writes a certificate for 127.0.0.1 and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	kb, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	s := httpserver.New(httpserver.Config{Name: "test", Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "secret") })})
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()

	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := c.Get("https://" + s.Addr() + "/x")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, "secret", string(b))
	require.Equal(t, "HTTP/2.0", resp.Proto, "HTTP/2 over TLS: a browser's six HTTP/1.1 connections would hang a seventh dashboard tab")
	h1 := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}}
	resp, err = h1.Get("https://" + s.Addr() + "/x")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "HTTP/1.1", resp.Proto, "a client without HTTP/2 is still answered")

	// Plain HTTP gets no answer from a TLS listener.
	plain := &http.Client{Timeout: 5 * time.Second}
	resp, err = plain.Get("http://" + s.Addr() + "/x")
	if err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a TLS server answers plain HTTP with 400 at most")
	}
}

func TestTLSBadKeyFailsAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "x.pem"), []byte("not pem"), 0o600))
	s := httpserver.New(httpserver.Config{Name: "web", Addr: "127.0.0.1:0", TLSCertFile: filepath.Join(dir, "x.pem"), TLSKeyFile: filepath.Join(dir, "x.pem")})
	err := s.Start(context.Background())
	require.ErrorContains(t, err, "web: load the TLS certificate and key")
}

// TestAStreamOverHTTP2OutlivesTheWriteTimeout: an event stream lifts the
// server's write timeout for itself (http.ResponseController, as
// web/live does), which must hold over HTTP/2 too, as browsers now speak
// it to a TLS server.
func TestAStreamOverHTTP2OutlivesTheWriteTimeout(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t, t.TempDir())
	// A write timeout of a second, which the handler outlives by a second:
	// at 200 ms a handler scheduled late on a loaded machine found its
	// stream already reset.
	s := httpserver.New(httpserver.Config{Name: "test", Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile, WriteTimeout: time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rc := http.NewResponseController(w)
			if r.URL.Path == "/stream" {
				require.NoError(t, rc.SetWriteDeadline(time.Time{}))
			}
			_, _ = io.WriteString(w, "a")
			_ = rc.Flush()
			time.Sleep(2 * time.Second)
			_, _ = io.WriteString(w, "b")
		})})
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	get := func(path string) (string, error) {
		resp, err := c.Get("https://" + s.Addr() + path)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		require.Equal(t, "HTTP/2.0", resp.Proto)
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	got, err := get("/stream")
	require.NoError(t, err)
	require.Equal(t, "ab", got)
	got, err = get("/plain")
	require.True(t, err != nil || got != "ab", "the write timeout holds for the others (got %q): the test proves nothing otherwise", got)
}
