// etcd's own main (go.etcd.io/etcd/v3's main.go), built at the version Kubernetes pins.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
