package projections

import (
	"strconv"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func strconvDecimal(v bson.RawValue) (float64, error) {
	return strconv.ParseFloat(v.Decimal128().String(), 64)
}
