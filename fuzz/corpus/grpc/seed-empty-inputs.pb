
m