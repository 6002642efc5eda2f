package store_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOnlyTheStoreTouchesMongoDB keeps the seam whole: outside store, no
// production code imports the driver's mongo package, so no change stream,
// query or write bypasses the store (and its conformance suite). The
// exceptions are the test harnesses that run mongod, the client package's
// constructor (it takes the caller's database and hands it to the store),
// and the benchmark program, whose floor and ceilings are raw driver
// loops by design.
func TestOnlyTheStoreTouchesMongoDB(t *testing.T) {
	allowed := map[string]bool{
		"store": true, "store/storetest": true, "internal/mongod": true, "internal/mongotest": true,
		"client": true, "cmd/disbatch-bench": true,
	}
	const driver = "go.mongodb.org/mongo-driver/v2/mongo"
	var offenders []string
	root := ".."
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != root) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if (p == driver || strings.HasPrefix(p, driver+"/")) && !allowed[filepath.ToSlash(rel)] {
				offenders = append(offenders, path+" imports "+p)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, offenders, "MongoDB is reached through package store only")
}
