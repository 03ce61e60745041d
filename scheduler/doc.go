// Package scheduler is the leader's loop: it keeps every entry's next slot
// in a heap, publishes due slots in batches, then persists their state.
package scheduler
