package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// postgres is a throwaway PostgreSQL server.
type postgres struct {
	dir     string
	bin     string
	url     string
	version string
	asUser  string // run its programs as this user ("" : as we are)
	log     *slog.Logger
}

// pgBin finds the directory of initdb and pg_ctl.
func pgBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i], nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("no PostgreSQL server programs (initdb, pg_ctl): install Debian's postgresql package (apt-get install postgresql)")
}

// startPostgres initialises a cluster in a temporary directory and starts
// it on a free loopback port, trusting local connections.
func startPostgres(ctx context.Context, log *slog.Logger) (*postgres, error) {
	bin, err := pgBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "dsb-river-pg-")
	if err != nil {
		return nil, err
	}
	pg := &postgres{dir: dir, bin: bin, log: log}
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root.
		u, err := user.Lookup("postgres")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root, PostgreSQL needs another user, and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		pg.asUser = "postgres"
	}
	data := filepath.Join(dir, "data")
	if out, err := pg.cmd(ctx, "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		pg.stop()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		pg.stop()
		return nil, err
	}
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=200", port, dir)
	start := pg.cmd(ctx, "pg_ctl", "-D", data, "-l", filepath.Join(dir, "log"), "-o", opts, "-w", "-t", "60", "start")
	if out, err := start.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		pg.stop()
		return nil, fmt.Errorf("pg_ctl start: %w: %s %s", err, out, log)
	}
	pg.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "postgres"), "--version").Output(); err == nil {
		pg.version = strings.TrimSpace(string(out))
	}
	log.Info("PostgreSQL started", "dir", dir, "port", port, "version", pg.version)
	return pg, nil
}

// cmd runs one of PostgreSQL's programs, as asUser if set.
func (pg *postgres) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	path := filepath.Join(pg.bin, name)
	if pg.asUser != "" {
		return exec.CommandContext(ctx, "runuser", append([]string{"-u", pg.asUser, "--", path}, args...)...)
	}
	return exec.CommandContext(ctx, path, args...)
}

// stop stops the server (fast shutdown) and removes its directory.
func (pg *postgres) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := filepath.Join(pg.dir, "data")
	if _, err := os.Stat(filepath.Join(data, "postmaster.pid")); err == nil {
		if out, err := pg.cmd(ctx, "pg_ctl", "-D", data, "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
			pg.log.Warn("pg_ctl stop", "error", err, "output", string(out))
		}
	}
	_ = os.RemoveAll(pg.dir)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
