package status

import (
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
)

// On a sharded cluster each shard's loop remembers its own entries' Live
// records, on the replica that leads it. So that any replica's view shows
// every entry's, a replica asks each other shard leader for the records
// of the entries its page shows (GET /status/live?LiveQuery), and that
// leader answers from its loops (LiveAnswer). The page is a range of
// names, so a request is the same few parameters whatever the page holds.

// LiveQuery asks a shard leader for the Live records of the entries of
// Shards (each with the term the asker's read of the election showed:
// a leader answers only for a term it holds) whose names follow After, go
// no further than Through and start with Prefix: the first Limit of them
// by name.
type LiveQuery struct {
	Shards                 map[int]int64
	After, Through, Prefix string
	Limit                  int
}

// MaxLiveLimit bounds a LiveQuery's Limit: the largest page of /status.
const MaxLiveLimit = 5000

// In reports whether the entry name is in q's range.
func (q LiveQuery) In(name string) bool {
	return name > q.After && name <= q.Through && strings.HasPrefix(name, q.Prefix)
}

// Values is q as URL parameters.
func (q LiveQuery) Values() url.Values {
	v := url.Values{"after": {q.After}, "through": {q.Through}, "prefix": {q.Prefix}, "limit": {strconv.Itoa(q.Limit)}}
	shards := make([]int, 0, len(q.Shards))
	for i := range q.Shards {
		shards = append(shards, i)
	}
	sort.Ints(shards)
	for _, i := range shards {
		v.Add("shard", fmt.Sprintf("%d:%d", i, q.Shards[i]))
	}
	return v
}

// ParseLiveQuery reads a LiveQuery from URL parameters.
func ParseLiveQuery(v url.Values) (LiveQuery, error) {
	q := LiveQuery{After: v.Get("after"), Through: v.Get("through"), Prefix: v.Get("prefix")}
	var err error
	if q.Shards, err = ParseShardTerms(v["shard"]); err != nil {
		return q, err
	}
	if q.Limit, err = strconv.Atoi(v.Get("limit")); err != nil || q.Limit < 1 || q.Limit > MaxLiveLimit {
		return q, fmt.Errorf("limit must be a number from 1 to %d, got %q", MaxLiveLimit, v.Get("limit"))
	}
	return q, nil
}

// ParseShardTerms reads shard=SHARD:TERM parameters: which shards a
// replica asks another about, each in the term it saw that one lead.
func ParseShardTerms(vals []string) (map[int]int64, error) {
	out := map[int]int64{}
	for _, v := range vals {
		i, t, ok := strings.Cut(v, ":")
		si, err1 := strconv.Atoi(i)
		ti, err2 := strconv.ParseInt(t, 10, 64)
		if !ok || err1 != nil || err2 != nil || si < 0 || ti <= 0 {
			return nil, fmt.Errorf("shard %q: want SHARD:TERM", v)
		}
		out[si] = ti
	}
	return out, nil
}

// LiveAnswer is a shard leader's answer to a LiveQuery: the asked shards
// it leads in the asked term, and the Live records of their entries in
// the range, by name. Truncated says more than Limit were in it.
type LiveAnswer struct {
	Shards    []int       `json:"shards"`
	Entries   []LiveEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

// LiveEntry is one entry's Live record, by name.
type LiveEntry struct {
	Name string `json:"name"`
	Live
}
