package config

import (
	"github.com/beatd/beatd/schedule"
	"gopkg.in/yaml.v3"
)

var solarKeys = []string{"event", "lat", "lon"}

// solar decodes `solar: {event: sunrise, lat: 52.52, lon: 13.40}`, with
// Celery's events and ranges.
func (d *decoder) solar(n *yaml.Node) schedule.Schedule {
	f := d.fields(n, "solar", solarKeys)
	if f == nil {
		return nil
	}
	ok := true
	for _, k := range solarKeys {
		if _, present := f.get(k); !present {
			d.errorf(n, "solar: missing key %s", k)
			ok = false
		}
	}
	if !ok {
		return nil
	}
	ev := deref(f.val("event"))
	if ev.Kind != yaml.ScalarNode || ev.Tag != "!!str" {
		d.errorf(ev, "solar event must be a string such as sunrise")
		return nil
	}
	lat, ok1 := d.number(f.val("lat"), "solar lat")
	lon, ok2 := d.number(f.val("lon"), "solar lon")
	if !ok1 || !ok2 {
		return nil
	}
	s, err := schedule.NewSolar(ev.Value, lat, lon)
	if err != nil {
		at := ev
		switch {
		case lat < -90 || lat > 90:
			at = deref(f.val("lat"))
		case lon < -180 || lon > 180:
			at = deref(f.val("lon"))
		}
		d.errorf(at, "%v", err)
		return nil
	}
	return s
}
