package mongotest

// The Docker fallback, used only when no mongod binary is found.

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/mongodb"

	"github.com/disbatch-go/disbatch/internal/mongod"
)

const (
	containerImage = "mongo:" + mongod.Version
	dockerPingWait = 2 * time.Second
)

// startContainer runs MongoDB as a single-member replica set in Docker, if a
// Docker engine answers a ping within dockerPingWait.
func startContainer(ctx context.Context) (uri string, stop func() error, err error) {
	if err := pingDocker(); err != nil {
		return "", nil, fmt.Errorf("no Docker engine (or none answered a ping within %v): %w", dockerPingWait, err)
	}
	c, err := mongodb.Run(ctx, containerImage, mongodb.WithReplicaSet("rs0"))
	if err != nil {
		if c != nil {
			_ = testcontainers.TerminateContainer(c)
		}
		return "", nil, fmt.Errorf("run %s: %w", containerImage, err)
	}
	stop = func() error { return testcontainers.TerminateContainer(c) }
	raw, err := c.ConnectionString(ctx)
	if err != nil {
		_ = stop()
		return "", nil, fmt.Errorf("connection string of %s: %w", containerImage, err)
	}
	// The member's host in the replica set config is the container's IP,
	// which the host cannot always reach (Docker Desktop): talk to the
	// mapped port directly instead. Change streams and transactions work
	// the same over a direct connection to the primary.
	u, err := url.Parse(raw)
	if err != nil {
		_ = stop()
		return "", nil, fmt.Errorf("connection string %q: %w", raw, err)
	}
	q := u.Query()
	q.Del("replicaSet")
	q.Set("directConnection", "true")
	u.RawQuery = q.Encode()
	return u.String(), stop, nil
}

// pingDocker asks the Docker engine testcontainers would use for a ping.
// testcontainers panics when it finds no Docker host at all.
func pingDocker() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), dockerPingWait)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	_, err = cli.Ping(ctx)
	return err
}
