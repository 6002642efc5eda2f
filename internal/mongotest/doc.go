// Package mongotest gives tests a real MongoDB replica set.
//
// Tests get MongoDB from the first of these that is available:
//
//  1. The MONGODB_URI environment variable: an existing replica set (or a
//     deployment that supports change streams and transactions), used as is.
//     Nothing is started or stopped.
//  2. A local mongod binary (see [mongod.Binary]: $DISBATCH_MONGOD, then the
//     cache filled by `make mongod` / scripts/fetch-mongod.sh, then mongod on
//     PATH), started with [mongod.StartReplicaSet] as a single-member replica
//     set "rs0" on a free loopback port, with its data in a temporary
//     directory.
//  3. testcontainers-go's MongoDB module (image mongo:6.0.5, single-member
//     replica set), tried only when no mongod binary is found and a Docker
//     engine answers a ping within about two seconds.
//  4. Otherwise the test fails (it is never skipped) with a message saying to
//     run `make mongod`, or to set DISBATCH_MONGOD to a mongod binary, or
//     MONGODB_URI to a replica set.
//
// A test package shares one deployment across all its tests:
//
//	func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		db := mongotest.Database(t) // fresh database, dropped after the test
//		...
//	}
//
// [URI] starts the shared deployment on first use and [Main] stops it after
// the tests. [Client] is a shared client for it and [Database] a fresh,
// uniquely named database per test.
//
// Tests that need their own deployment (several members, failover, restarts)
// use [mongod.StartReplicaSet] directly and Stop it when done.
//
// # Crash safety
//
// The shared mongod never outlives the test binary, even if it panics,
// calls os.Exit or is killed with SIGKILL (see package mongod: Pdeathsig and
// a watchdog process). So a package that uses [Database] without [Main]
// still leaves nothing behind, it just stops mongod less gracefully.
package mongotest
