//go:build !amd64

package cpu

func geluTanhForwardVec(out, inp []float32) int                             { return 0 }
func geluTanhBackwardVec(dinp, dout, inp []float32) int                     { return 0 }
func ceGradVec(dx, x []float32, lse, g, u float32) int                      { return 0 }
func axpyVec(y, x []float32, a float32) int                                 { return 0 }
func geluErfForwardVec(out, inp []float32) int                              { return 0 }
func geluErfBackwardVec(dinp, dout, inp []float32) int                      { return 0 }
func siluForwardVec(out, inp []float32) int                                 { return 0 }
func siluBackwardVec(dinp, dout, inp []float32) int                         { return 0 }
func swigluForwardVec(out, gate, up []float32) int                          { return 0 }
func swigluBackwardVec(dgate, dup, dout, gate, up []float32) int            { return 0 }
func addVec(out, a, b []float32) int                                        { return 0 }
func lnParamGradVec(dw, g, x []float32, mean, rstd float32) int             { return 0 }
func dotF64Vec(a, b []float32, acc *[dotLanes]float64) int                  { return 0 }
func dotsF64Vec(out []float64, q, k []float32, ldk int, scale float64) bool { return false }
func axpysVec(y, x []float32, ldx int, w []float32) bool                    { return false }
