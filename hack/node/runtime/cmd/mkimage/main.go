// mkimage writes a single-layer image, as a tarball that `ctr images import` reads, from
// files of this machine: no engine, no registry, no base image.
//
//	mkimage -o memcached.tar -name envtest.local/memcached:1.6.38 \
//	  -entrypoint /usr/bin/memcached -user 65534 \
//	  /usr/bin/memcached=bin/memcached-1.6.38/memcached /lib/x86_64-linux-gnu/libc.so.6 ...
//
// Each argument is IMAGE_PATH=HOST_PATH, or a host path copied to the same path in the
// image; symlinks are followed (the image holds the file's contents). Every file's parent
// directories are created; /etc/passwd and /etc/group name root and nobody; /tmp is there.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	out := flag.String("o", "", "the image tarball to write")
	ref := flag.String("name", "", "the image's name, as pods name it (REPO:TAG)")
	entrypoint := flag.String("entrypoint", "", "the entrypoint (one path; arguments come from the pod)")
	user := flag.String("user", "", "the user the entrypoint runs as (numeric)")
	flag.Parse()
	if *out == "" || *ref == "" || *entrypoint == "" {
		fmt.Fprintln(os.Stderr, "usage: mkimage -o OUT.tar -name REPO:TAG -entrypoint PATH [-user UID] [IMAGE_PATH=]HOST_PATH...")
		os.Exit(2)
	}
	if err := run(*out, *ref, *entrypoint, *user, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, ref, entrypoint, user string, files []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	contents := map[string]string{} // image path -> host path
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok {
			src = dst
		}
		contents[path.Clean("/"+dst)] = src
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		b, err := layerTar(contents)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture = "amd64"
	cfg.OS = "linux"
	cfg.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cfg.Config.Entrypoint = []string{entrypoint}
	cfg.Config.User = user
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}

// layerTar is the layer: the files with their parent directories, /etc/passwd, /etc/group
// and /tmp, in a fixed order with fixed times (the same files give the same image).
func layerTar(contents map[string]string) ([]byte, error) {
	extra := map[string][]byte{
		"/etc/passwd": []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"),
		"/etc/group":  []byte("root:x:0:\nnogroup:x:65534:\n"),
	}
	dirs := map[string]bool{"/tmp": true}
	var paths []string
	for p := range contents {
		paths = append(paths, p)
	}
	for p := range extra {
		paths = append(paths, p)
	}
	for _, p := range paths {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var dirList []string
	for d := range dirs {
		dirList = append(dirList, d)
	}
	sort.Strings(dirList)
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, d := range dirList {
		mode := int64(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: epoch}); err != nil {
			return nil, err
		}
	}
	for _, p := range paths {
		var data []byte
		mode := int64(0o644)
		if b, ok := extra[p]; ok {
			data = b
		} else {
			src := contents[p]
			st, err := os.Stat(src)
			if err != nil {
				return nil, err
			}
			if st.IsDir() {
				return nil, fmt.Errorf("%s is a directory: name its files", src)
			}
			mode = int64(st.Mode().Perm())
			if data, err = os.ReadFile(src); err != nil {
				return nil, err
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: mode, Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
