package solver

import "math"

var inf = math.Inf(1)
