// Package celery builds Celery task protocol v2 messages exactly as Kombu
// writes them: a task's description (Spec), its compiled template (Task),
// one fire of it (Fire), the chain and callbacks it carries in the
// protocol's embed (Canvas), the slot placeholders its values may hold
// (template.go), and the Python-exact encodings (json.dumps and repr) its
// arguments need. It also holds the vocabulary the config shares
// with it, so neither depends on the other: the Python values a task's
// arguments carry (nil, bool, int64, *big.Int, float64, string, []any and
// the insertion-ordered Map), the send options beatd understands, and the
// headers beatd reserves. It does no I/O: the brokers send what it builds.
package celery
