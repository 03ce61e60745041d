#!/usr/bin/python3
"""Sample the Sun's geocentric apparent position from ephem (python3-ephem
4.1.4, the library Celery's solar schedule uses), for fitting beatd's
longitude correction (schedule/solar_fit.go).

Each line: Julian day (UT), apparent right ascension and declination
(radians), distance (AU), at 6,000 pseudo-random instants in 2000-2060.

    /usr/bin/python3 gen_sun_samples.py > /tmp/sun_samples.txt
    BEATD_FIT_SUN=/tmp/sun_samples.txt go test -run TestFitSunCorrection -v ./schedule
"""
import random

import ephem

r = random.Random(1)
o = ephem.Observer()
o.lat, o.lon, o.elev, o.pressure = "0", "0", 0, 0
for _ in range(6000):
    jd = 2451545.0 + r.uniform(0, 365.25 * 60)
    o.date = jd - 2415020.0  # ephem counts days from 1899-12-31 12:00
    s = ephem.Sun(o)
    print("%.9f %.12f %.12f %.12f" % (jd, float(s.g_ra), float(s.g_dec), s.earth_distance))
