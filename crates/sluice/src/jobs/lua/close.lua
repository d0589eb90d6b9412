-- sluice jobs: closes a bucket function opened by open_*.lua.
end
