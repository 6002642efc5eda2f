package store_test

import (
	"os"
	"testing"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/internal/mongotest"
	"github.com/disbatch-go/disbatch/store"
	"github.com/disbatch-go/disbatch/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(mongotest.Main(m)) }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, opts store.Options) (*store.Store, *mongo.Database) {
		db := mongotest.Database(t)
		return store.New(db, opts), db
	})
}
