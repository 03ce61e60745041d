package celery

// Map is a string-keyed mapping that keeps the order it was written in.
// Celery serialises kwargs in insertion order, and so does beatd.
type Map struct {
	Keys   []string
	Values []any
}

// Get returns the value for key and whether it is present.
func (m *Map) Get(key string) (any, bool) {
	if m == nil {
		return nil, false
	}
	for i, k := range m.Keys {
		if k == key {
			return m.Values[i], true
		}
	}
	return nil, false
}

// Set replaces key's value, or appends the pair when key is new.
func (m *Map) Set(key string, v any) {
	for i, k := range m.Keys {
		if k == key {
			m.Values[i] = v
			return
		}
	}
	m.Keys = append(m.Keys, key)
	m.Values = append(m.Values, v)
}

// Len returns the number of pairs; a nil Map is empty.
func (m *Map) Len() int {
	if m == nil {
		return 0
	}
	return len(m.Keys)
}
