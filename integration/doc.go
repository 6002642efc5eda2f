// Package integration holds cross-package tests that run real processes
// against real servers: several disbatchd nodes, a three-member replica set,
// faults injected through a TCP proxy.
package integration
