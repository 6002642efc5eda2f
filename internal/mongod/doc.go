// Package mongod starts and controls real mongod processes as a MongoDB
// replica set on loopback ports: [StartReplicaSet] starts and initiates one,
// each [Member] of the [ReplicaSet] can be killed, stopped and restarted (to
// test failover, for instance), and [Binary] finds the mongod to run.
//
// Tests use it through internal/mongotest (a shared replica set per test
// binary) or directly (a set of their own, with several members). The local
// development environment (cmd/disbatch-dev) uses it to run a persistent
// replica set: with [Options].Dir and [Options].Ports, the data outlives the
// processes and the next start reuses it.
//
// # Processes
//
// mongod processes started here never outlive the program that started
// them: on Linux each gets Pdeathsig=SIGKILL. Without Options.Dir, the data
// lives in a temporary directory, and each [ReplicaSet] also has a detached
// watchdog shell process that, once the program has gone (even by panic,
// os.Exit or SIGKILL), kills the replica set's mongod processes (whose pids
// it reads from pid files in the data directory) and removes the directory.
// With Options.Dir there is no watchdog: the data is kept.
package mongod
