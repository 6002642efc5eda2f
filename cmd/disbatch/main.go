// Command disbatch is the operator CLI of a Disbatch 4 database: see
// `disbatch --help`.
package main

import (
	"os"

	"github.com/disbatch-go/disbatch/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
