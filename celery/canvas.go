package celery

// Step is one task of a chain, or a callback (link) or error callback
// (link_error): a Celery signature, as signature(task, args, kwargs,
// options, immutable) writes it into a message's embed.
type Step struct {
	Task   string
	Args   []any
	Kwargs *Map
	// Options are the signature's options as written (queue, priority,
	// ...), in order: the worker passes them to apply_async when it sends
	// the step.
	Options *Map
	// Immutable is Celery's si(): the step does not take the previous
	// step's result as its first argument.
	Immutable bool
}

// Canvas is what an entry sends besides its own task: the rest of a chain
// and its callbacks. Celery task protocol v2 carries it in the body's
// third element, the embed, so an unmodified worker runs it.
type Canvas struct {
	// Chain are the steps after the entry's task, in the order they run.
	Chain []Step
	// Link runs after the last task succeeds, with its result unless
	// immutable; LinkError runs when any task fails.
	Link, LinkError []Step
}

// Bounds on a canvas: each step travels in every message, and the worker
// walks them; config reports them with the entry's position.
const (
	MaxChainSteps = 32 // steps after the entry's task
	MaxCallbacks  = 8  // in link, and in link_error
)

// appendEmbed writes the embed of a message whose task id is id, as
// Celery 5.2's canvas writes it (celery/testdata/canvas has the captures):
//
//   - without a chain, link and link_error become the message's callbacks
//     and errbacks;
//   - chain(a, b, c).apply_async(link=L, link_error=E) sends a with
//     errbacks E and chain [c, b] (reversed: the worker pops the next
//     step from the end); each chained step's options get a task_id,
//     reply_to and link_error E, and the last one's link L.
//
// Celery draws each chained step's task_id at random; beatd derives it
// from the message's task id and the step's place, and reply_to from the
// cluster, so a slot published again (failover, backfill) carries the
// same embed and the same ids.
func (c *Canvas) appendEmbed(dst []byte, id, replyTo [36]byte) []byte {
	if c == nil {
		return append(dst, `{"callbacks": null, "errbacks": null, "chain": null, "chord": null}`...)
	}
	dst = append(dst, `{"callbacks": `...)
	if len(c.Chain) == 0 {
		dst = appendSteps(dst, c.Link)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `, "errbacks": `...)
	dst = appendSteps(dst, c.LinkError)
	dst = append(dst, `, "chain": `...)
	if len(c.Chain) == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i := len(c.Chain) - 1; i >= 0; i-- {
			if i < len(c.Chain)-1 {
				dst = append(dst, ", "...)
			}
			s := &c.Chain[i]
			opts := &Map{}
			if s.Options != nil {
				opts.Keys = append(opts.Keys, s.Options.Keys...)
				opts.Values = append(opts.Values, s.Options.Values...)
			}
			sid := StepID(id, i+1)
			opts.Set("task_id", string(sid[:]))
			opts.Set("reply_to", string(replyTo[:]))
			if len(c.LinkError) > 0 {
				opts.Set("link_error", stepsValue(c.LinkError))
			}
			if i == len(c.Chain)-1 && len(c.Link) > 0 {
				opts.Set("link", stepsValue(c.Link))
			}
			dst = appendJSON(dst, stepValue(s, opts))
		}
		dst = append(dst, ']')
	}
	return append(dst, `, "chord": null}`...)
}

// StepID is the task id of the chain's step n (1 is the first step after
// the entry's task) in the message whose task id is id: UUIDv5 of
// "<id>/chain/<n>" in beatd's namespace, so a consumer can recompute it.
func StepID(id [36]byte, n int) [36]byte {
	var buf [64]byte
	name := append(append(buf[:0], id[:]...), "/chain/"...)
	name = appendInt(name, n)
	return uuid5(name)
}

func appendInt(dst []byte, n int) []byte {
	if n >= 10 {
		dst = appendInt(dst, n/10)
	}
	return append(dst, byte('0'+n%10))
}

func appendSteps(dst []byte, steps []Step) []byte {
	if len(steps) == 0 {
		return append(dst, "null"...)
	}
	return appendJSON(dst, stepsValue(steps))
}

func stepsValue(steps []Step) []any {
	out := make([]any, len(steps))
	for i := range steps {
		out[i] = stepValue(&steps[i], steps[i].Options)
	}
	return out
}

// stepValue is a signature as dict(signature) writes it.
func stepValue(s *Step, opts *Map) *Map {
	args := s.Args
	if args == nil {
		args = []any{}
	}
	kwargs, options := s.Kwargs, opts
	if kwargs == nil {
		kwargs = &Map{}
	}
	if options == nil {
		options = &Map{}
	}
	return &Map{
		Keys:   []string{"task", "args", "kwargs", "options", "subtask_type", "immutable"},
		Values: []any{s.Task, args, kwargs, options, nil, s.Immutable},
	}
}

// EmbedSize is the length of c's embed in a message, for the bound on an
// entry's values; past limit (limit < 0: none) it may stop counting and
// return a size above limit. A nil Canvas adds nothing.
func (c *Canvas) EmbedSize(limit int) int {
	if c == nil {
		return 0
	}
	// Celery copies link_error into every chained step: count it as sent.
	n := JSONSize(stepsValue(c.Chain), limit) + JSONSize(stepsValue(c.Link), limit)
	if limit >= 0 && n > limit {
		return n
	}
	return n + (len(c.Chain)+1)*(JSONSize(stepsValue(c.LinkError), limit)+96)
}
