# Sourced by scripts/configure.sh and by the wheel step of scripts/gpu-check.sh. The PyTorch layer needs a
# g++ with a shared libstdc++ (CMakeLists.txt says why). Where the compiler CMake would take ($CXX, else
# c++ or g++ on PATH) has none (a toolchain of static libraries only) and /usr/bin/g++ has one, this
# exports /usr/bin/g++ (and gcc) as CXX, CC and CUDAHOSTCXX.
has_shared_libstdcxx() { [[ $("$1" -print-file-name=libstdc++.so 2>/dev/null) == /* ]]; }
picked_cxx=${CXX:-$(command -v c++ || command -v g++ || true)}
if [ -n "$picked_cxx" ] && ! has_shared_libstdcxx "$picked_cxx" && [ -x /usr/bin/g++ ] &&
  has_shared_libstdcxx /usr/bin/g++; then
  echo "$picked_cxx has no shared libstdc++; using /usr/bin/g++"
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
fi
unset picked_cxx
