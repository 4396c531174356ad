package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flameReport are the arguments of a report on the bundled FLAME plans,
// 2 nodes × 4 GPUs.
var flameReport = []string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--nodes", "2", "--gpus-per-node", "4",
	"--plan", "testdata/plans/flame-contiguous.json", "--plan", "testdata/plans/flame-joint.json"}

func TestReportCommand(t *testing.T) {
	chdirRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "r.html")
	code, stdout, stderr := runCLI(t, append([]string{"report", "--out", out}, flameReport...)...)
	require.Equal(t, 0, code, stderr)
	// 2 plans × (load, GPU traffic, node traffic) + busiest/mean + cross-node.
	assert.Contains(t, stdout, "wrote "+out+": 2 plans, 8 plots")
	page, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, 8, strings.Count(string(page), `<img class="plot"`))
	assert.Contains(t, string(page), "<td>flame-joint.json</td>")

	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no plan":       {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl"}, 2, "report needs --plan FILE"},
		"no trace":      {[]string{"--plan", "testdata/plans/flame-joint.json"}, 2, "no --trace"},
		"positional":    {append([]string{"x"}, flameReport...), 2, "report takes no positional arguments"},
		"gpu mismatch":  {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "testdata/plans/mixtral-joint.json"}, 1, "mixtral-joint.json"},
		"missing plan":  {[]string{"--trace", "testdata/flame-moe-290m/trace.jsonl", "--plan", "nope.json"}, 1, "nope.json"},
		"bad replay":    {append([]string{"--replay", writeFile(t, dir, "bad-replay.json", `{"plans": []}`)}, flameReport...), 1, "--replay " + filepath.Join(dir, "bad-replay.json") + ": report: replay: no plans"},
		"replay syntax": {append([]string{"--replay", writeFile(t, dir, "syntax.json", `{"plans": [`)}, flameReport...), 1, "--replay " + filepath.Join(dir, "syntax.json") + ": report: replay: unexpected end of JSON input"},
		"bad backtest": {append([]string{"--backtest", writeFile(t, dir, "bt.json", `{"windows": ["a", "b"], "series": [{"name": "x", "values": [1]}]}`)}, flameReport...), 1,
			`report: backtest: series[0] "x" has 1 values for 2 windows`},
	} {
		t.Run(name, func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "out.html")
			code, _, stderr := runCLI(t, append([]string{"report", "--out", target}, tc.args...)...)
			assert.Equal(t, tc.code, code)
			assert.Contains(t, stderr, tc.want)
			_, err := os.Stat(target)
			assert.ErrorIs(t, err, os.ErrNotExist, "nothing written on error")
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	return path
}

// chromium finds Debian's chromium (.ci/run installs it when missing).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium is not installed (.ci/run installs Debian's chromium when it can)")
	return ""
}

// headless runs chromium on the page with the network cut off: a proxy
// that refuses every connection and a resolver that finds no host, so a
// page that needed anything from elsewhere would not render completely.
func headless(t *testing.T, bin, profile string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--hide-scrollbars", "--force-device-scale-factor=1", "--proxy-server=http://127.0.0.1:9",
		"--host-resolver-rules=MAP * ~NOTFOUND", "--user-data-dir=" + profile, "--virtual-time-budget=10000"}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "chromium %v: %s", args, tail(stderr.String(), 2000))
	return stdout.Bytes()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var (
	bodyRE = regexp.MustCompile(`<body data-plots="(\d+)" data-decoded="(\d+)" data-rects="([^"]*)" data-height="(\d+)">`)
	plotRE = regexp.MustCompile(`<img class="plot" alt="[^"]*" width="(\d+)" height="(\d+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">`)
)

// TestReportInChromium renders a report with replay measurements and a
// backtest in headless Chromium, with the network cut off. Every plot must
// decode (the page's script counts images with naturalWidth > 0), the count
// must be the one the input calls for, and in the screenshot every plot's
// box must hold the embedded image (pixel for pixel, within anti-aliasing)
// with data drawn in it (colored pixels). It catches a page that loads
// anything from the network, a plot that fails to decode or is left out,
// an image drawn blank, and a layout that hides plots.
func TestReportInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cpu replay and headless Chromium")
	}
	bin := chromium(t)
	chdirRoot(t)
	dir := t.TempDir()
	rj := filepath.Join(dir, "replay.json")
	code, _, stderr := runCLI(t, "replay", "--trace", "testdata/flame-moe-290m/trace.jsonl", "--nodes", "2", "--gpus-per-node", "4",
		"--plan", "testdata/plans/flame-contiguous.json", "--plan", "testdata/plans/flame-joint.json",
		"--backend", "cpu", "--hidden", "32", "--ffn", "112", "--batch-tokens", "256", "--repeats", "1", "--rounds", "3", "--json", rj)
	require.Equal(t, 0, code, stderr)
	bt := writeFile(t, dir, "backtest.json", `{"title": "held-out hours", "unit": "modeled layer time (µs)", "windows": ["h1", "h2", "h3", "h4"],
		"series": [{"name": "contiguous", "values": [344, 351, 339, 348]}, {"name": "joint", "values": [338, 340, 336, 341]}]}`)
	page := filepath.Join(dir, "report.html")
	code, stdout, stderr := runCLI(t, append([]string{"report", "--out", page, "--replay", rj, "--backtest", bt}, flameReport...)...)
	require.Equal(t, 0, code, stderr)
	// 2 plans × (load, GPU traffic, node traffic), busiest/mean and
	// cross-node per layer, replay tail and differences, the backtest.
	const want = 2*3 + 2 + 2 + 1
	require.Contains(t, stdout, fmt.Sprintf("%d plots", want))
	html, err := os.ReadFile(page)
	require.NoError(t, err)
	assert.NotRegexp(t, `(?i)(src|href)="(https?:)?//`, string(html), "the page must not load anything from the network")
	embedded := plotRE.FindAllStringSubmatch(string(html), -1)
	require.Len(t, embedded, want)

	profile := filepath.Join(dir, "profile")
	url := "file://" + page
	dom := headless(t, bin, profile, "--window-size=1400,1000", "--dump-dom", url)
	m := bodyRE.FindSubmatch(dom)
	require.NotNil(t, m, "no measured <body> in the DOM chromium dumped: %s", tail(string(dom), 500))
	assert.Equal(t, strconv.Itoa(want), string(m[1]), "plots on the page")
	assert.Equal(t, strconv.Itoa(want), string(m[2]), "plots chromium decoded")
	var rects [][4]int
	require.NoError(t, json.Unmarshal([]byte(strings.ReplaceAll(string(m[3]), "&quot;", `"`)), &rects))
	require.Len(t, rects, want)
	height, err := strconv.Atoi(string(m[4]))
	require.NoError(t, err)
	require.Less(t, height, 20000)

	shot := filepath.Join(dir, "report.png")
	headless(t, bin, profile, fmt.Sprintf("--window-size=1400,%d", height), "--screenshot="+shot, url)
	f, err := os.Open(shot)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err)
	for k, r := range rects {
		box := image.Rect(r[0], r[1], r[0]+r[2], r[1]+r[3])
		require.True(t, box.In(img.Bounds()), "plot %d at %v lies outside the %v screenshot", k, box, img.Bounds())
		w, _ := strconv.Atoi(embedded[k][1])
		h, _ := strconv.Atoi(embedded[k][2])
		assert.Equal(t, [2]int{w, h}, [2]int{r[2], r[3]}, "plot %d drawn at its natural size", k)
		data, err := base64.StdEncoding.DecodeString(embedded[k][3])
		require.NoError(t, err)
		src, err := png.Decode(bytes.NewReader(data))
		require.NoError(t, err)
		assert.Less(t, meanAbsDiff(img, box, src), 4.0, "plot %d: the screenshot's box does not show the embedded image", k)
		assert.Greater(t, inked(img, box), 150, "plot %d is blank in the screenshot", k)
	}
}

// meanAbsDiff is the mean absolute difference per channel (0-255) between
// the box of img and src drawn at its origin.
func meanAbsDiff(img image.Image, box image.Rectangle, src image.Image) float64 {
	var sum float64
	n := 0
	for y := 0; y < box.Dy(); y++ {
		for x := 0; x < box.Dx(); x++ {
			r1, g1, b1, _ := img.At(box.Min.X+x, box.Min.Y+y).RGBA()
			r2, g2, b2, _ := src.At(src.Bounds().Min.X+x, src.Bounds().Min.Y+y).RGBA()
			sum += absDiff(r1, r2) + absDiff(g1, g2) + absDiff(b1, b2)
			n += 3
		}
	}
	return sum / float64(n)
}

func absDiff(a, b uint32) float64 {
	if a > b {
		return float64(a-b) / 257
	}
	return float64(b-a) / 257
}

// inked counts the chromatic pixels in the left three quarters of box (the
// plot area; heatmaps keep their color bar on the right): data is drawn in
// color, axes, text and grid lines in gray, so an empty plot has none.
func inked(img image.Image, box image.Rectangle) int {
	box.Max.X = box.Min.X + 3*box.Dx()/4
	ink := 0
	for y := box.Min.Y; y < box.Max.Y; y++ {
		for x := box.Min.X; x < box.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if (max(r, g, b)-min(r, g, b))>>8 > 40 {
				ink++
			}
		}
	}
	return ink
}
