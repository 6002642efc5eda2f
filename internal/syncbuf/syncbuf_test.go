package syncbuf

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConcurrentWritesAndReads(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "w%d.%d;", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 800, b.Count(";"))
	require.Equal(t, 1, b.Count("w3.42;"))
}
