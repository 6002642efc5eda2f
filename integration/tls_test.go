package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

// testCA makes a certificate authority and a server certificate for
// 127.0.0.1 signed by it, in dir: ca.pem, and server.pem (certificate and
// key, as mongod's --tlsCertificateKeyFile wants them).
func testCA(t *testing.T, dir string) (caFile, serverFile string, pool *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "disbatch test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)
	caFile, serverFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem")
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	server := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...)
	require.NoError(t, os.WriteFile(serverFile, server, 0o600))
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return caFile, serverFile, pool
}

// TestTLSToMongoDB: against a mongod that requires TLS (a CA made here),
// the node, the CLI and the web server connect with tls=true and the CA
// file in the URI, and run a task end to end; without TLS they fail,
// saying so.
func TestTLSToMongoDB(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile, serverFile, pool := testCA(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := mongod.StartReplicaSet(ctx, mongod.Options{
		ExtraArgs: []string{"--tlsMode", "requireTLS", "--tlsCertificateKeyFile", serverFile, "--tlsCAFile", caFile,
			"--tlsAllowConnectionsWithoutCertificates"},
		ClientTLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = rs.Stop() })
	uri := rs.URI() + "&tls=true&tlsCAFile=" + caFile
	const db = "tlsdb"

	cli(t, uri, db, "", "queue", "create", "q", "--constructor", "Disbatch::Plugin::Demo")
	cli(t, uri, db, `{"commands":"a"}`+"\n", "task", "submit", "q")
	node := startNode(t, nodeArgs(uri, db, "tls-1"))
	require.Eventually(t, func() bool {
		return strings.Contains(runBin(t, disbatchBin, "", nil, "--mongo-uri", uri, "--database", db, "task", "list", "q").stdout, "succeeded")
	}, 60*time.Second, 200*time.Millisecond, "the task ran over TLS: %s", node.log.String())

	web := startWeb(t, []string{"--listen", "127.0.0.1:0", "--mongo-uri", uri, "--database", db, "--log-format", "text"})
	web.waitLog("serving the Disbatch HTTP API", startWait)
	m := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)/`).FindStringSubmatch(web.log.String())
	require.NotNil(t, m)
	resp, err := http.Get(m[1] + "/api/v1/queues")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "disbatch-web reads over TLS")

	// Without TLS the server closes every connection: a clear failure.
	plain := rs.URI() + "&serverSelectionTimeoutMS=2000&connectTimeoutMS=2000"
	r := runBin(t, disbatchBin, "", nil, "--mongo-uri", plain, "--database", db, "queue", "list")
	require.NotZero(t, r.code, "a plain connection to a TLS-only server fails")
	require.NotEmpty(t, r.stderr)
}
