// Package apitest tests `tabbyctl ipam` end to end: a real kube-apiserver
// and etcd (internal/controlplane/clustertest), addresses assigned by the real
// allocator (package ipam), leaks and double bookings made by hand, and the
// built tabbyctl binary run as a user would, its output, JSON and exit
// status checked. It has no code outside its tests.
package apitest
