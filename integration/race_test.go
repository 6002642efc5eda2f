//go:build race

package integration

func init() { raceBuild = true }
