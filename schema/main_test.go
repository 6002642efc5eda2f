package schema

import (
	"os"
	"testing"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }
