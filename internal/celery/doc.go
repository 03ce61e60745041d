// Package celery is the vocabulary of Celery's task messages that the
// config and the publisher share, so neither depends on the other: the
// Python values a task's arguments carry (nil, bool, int64, *big.Int,
// float64, string, []any and the insertion-ordered Map) and the send
// options beatd understands.
package celery
