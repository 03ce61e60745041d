package schedule

import "math"

// The Sun's longitude from Meeus's low-accuracy theory (solar.go) is off
// by up to about 35″ from ephem's, mostly through the planets' and the
// Moon's pull, which that theory leaves out. Near the polar circles, where
// the Sun grazes the horizon, arcseconds become minutes. So beatd adds a
// correction fitted by least squares against ephem itself
// (testdata/gen_sun_samples.py samples 2000-2060; TestFitSunCorrection
// refits and prints this table): a quadratic in time plus sine and cosine
// terms at the main periods of the Earth's motion (the annual harmonics,
// Jupiter, Venus, Mars, Saturn, the Moon's elongation). What remains is
// 0.44″ rms, 1.6″ at worst, over the sample.

// sunFitFreqs are the terms' frequencies in radians per Julian millennium.
var sunFitFreqs = []float64{6283.07585, 12566.1517, 18849.228, 5753.3849, 77713.7715, 7860.4194,
	3930.2097, 11506.7698, 529.691, 1577.3435, 5884.927, 398.149, 5223.694, 5507.553, 775.523,
	11790.629, 796.298, 10977.079, 5486.778, 2544.314, 5573.143, 6069.777, 213.299, 2942.463,
	4694.003, 15720.839, 155.420}

// sunLonFit are the fitted coefficients in arcseconds: 1, T, T², then a
// sine and a cosine per frequency.
var sunLonFit = []float64{-3.02919658901243, -6.2914792643574495, 11.384120264138641, 0.061535266410493644, 0.13570220970048202, 0.006171485012895255, -0.019431445948438972, 0.05110067733873128, 0.009767178680696705, -8.071999093135378, -11.544046357244937, -3.335272925304474, -4.683660773829986, 1.9552046765815945, 2.8528984766027774, 2.8621239819412287, 9.083532002460608, -1.8527019437487926, 2.0083691075825585, -2.3480997782528314, -1.1161409422203645, -2.227371106149357, 1.0744672524511107, 1.8207429564732003, 1.0938228583138943, 0.6084956002526154, -1.654636835788232, -1.5046767764431208, 0.6292723728681827, -1.056978742137872, -1.383647113796772, 0.7639874579928398, -0.4820187776827662, 0.30741171167451437, 0.610597501892504, -0.28894317814943254, -0.2530219019236104, -0.16155110677625542, 0.5277107695304804, -0.11248496678863014, 0.6353900333423368, 0.4537991829578579, 0.04054957680952747, -0.40700863571922086, -0.18983347763045966, -0.2525307542964522, -0.2993565346343364, -0.2438916338627976, 0.22620705864440419, 0.09929331694831549, -0.28097218277686103, -0.1011429949439016, 0.16024082522739302, -0.175437166321655, 0.1192455573725503, -0.048769894750961267, 0.15169816940084963}

// sunFitRow is the fit's regressors at T, Julian centuries (TT) from
// J2000. The polynomial part is held at the ends of the fitted span
// rather than extrapolated.
func sunFitRow(T float64) []float64 {
	Tc := min(max(T, 0), 0.6)
	row := make([]float64, 0, 3+2*len(sunFitFreqs))
	row = append(row, 1, Tc, Tc*Tc)
	for _, f := range sunFitFreqs {
		a := f * T / 10
		row = append(row, math.Sin(a), math.Cos(a))
	}
	return row
}

// sunLonCorrection is the fitted correction in arcseconds at T.
func sunLonCorrection(T float64) float64 {
	c := sunLonFit[0] + sunLonFit[1]*min(max(T, 0), 0.6) + sunLonFit[2]*math.Pow(min(max(T, 0), 0.6), 2)
	for i, f := range sunFitFreqs {
		a := f * T / 10
		c += sunLonFit[3+2*i]*math.Sin(a) + sunLonFit[4+2*i]*math.Cos(a)
	}
	return c
}
