module gpugate.io/e2e/floor-webhook

go 1.26.0
