package controlplane

// StartProcessForTest exposes startProcess to the package's tests.
var StartProcessForTest = startProcess
