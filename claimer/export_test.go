package claimer

// Rank is rank, for the tests.
var Rank = rank
